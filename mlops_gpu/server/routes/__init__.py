"""The API's routes, one module per resource; ``app.create_app`` includes each router."""
