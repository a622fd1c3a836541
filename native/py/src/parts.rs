//! The typed classes for MIG slices and shared GPUs (`mlops_gpu_native::parts`): a node's
//! parts (`PartSpec`, `MigSpec`), a run's shape (`ShapeSpec`, CPU-only runs' too) and the share a held slot holds
//! (`SlotShare`); built with keyword arguments, like every class of this module.

use mlops_gpu_native as lib;
use pyo3::prelude::*;

#[pyclass(frozen, module = "mlops_gpu._engine")]
#[derive(Clone)]
pub struct MigSpec(pub lib::parts::MigSpec);

#[pymethods]
impl MigSpec {
    #[new]
    #[pyo3(signature = (*, profile, slices))]
    fn new(profile: usize, slices: usize) -> Self {
        MigSpec(lib::parts::MigSpec { profile, slices })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

#[pyclass(frozen, module = "mlops_gpu._engine")]
#[derive(Clone)]
pub struct PartSpec(pub lib::parts::PartSpec);

#[pymethods]
impl PartSpec {
    #[new]
    #[pyo3(signature = (*, node, mig, mig_placeable, shared, shared_node, gpu_memory_mb, name_rank))]
    fn new(
        node: usize,
        mig: Vec<MigSpec>,
        mig_placeable: bool,
        shared: bool,
        shared_node: bool,
        gpu_memory_mb: Option<i64>,
        name_rank: Vec<u32>,
    ) -> Self {
        PartSpec(lib::parts::PartSpec {
            node,
            mig: mig.into_iter().map(|x| x.0).collect(),
            mig_placeable,
            shared,
            shared_node,
            gpu_memory_mb,
            name_rank,
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// A MIG request (`mig`: the profile's number, `mig_share`: a slice's share of a GPU), a
/// shared one (`fraction` and/or `memory_mb`), or a CPU-only one (`cpu_only`: no GPU, host
/// CPU and/or memory only; with none of the others).
#[pyclass(frozen, module = "mlops_gpu._engine")]
#[derive(Clone)]
pub struct ShapeSpec(pub lib::Shape);

#[pymethods]
impl ShapeSpec {
    #[new]
    #[pyo3(signature = (*, mig=None, mig_share=1.0, fraction=None, memory_mb=None, cpu_only=false))]
    fn new(
        mig: Option<usize>,
        mig_share: f64,
        fraction: Option<f64>,
        memory_mb: Option<i64>,
        cpu_only: bool,
    ) -> PyResult<Self> {
        Ok(ShapeSpec(match mig {
            _ if cpu_only => {
                if mig.is_some() || fraction.is_some() || memory_mb.is_some() {
                    return Err(pyo3::exceptions::PyValueError::new_err(
                        "ShapeSpec: cpu_only takes no mig, fraction or memory_mb",
                    ));
                }
                lib::Shape::Cpu
            }
            Some(profile) => lib::Shape::Mig {
                profile,
                share: mig_share,
            },
            None => lib::Shape::Shared {
                fraction,
                memory_mb,
            },
        }))
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

#[pyclass(frozen, module = "mlops_gpu._engine")]
#[derive(Clone)]
pub struct SlotShare(pub lib::SlotShare);

#[pymethods]
impl SlotShare {
    #[new]
    #[pyo3(signature = (*, fraction, memory_mb))]
    fn new(fraction: f64, memory_mb: Option<i64>) -> Self {
        SlotShare(lib::SlotShare {
            fraction,
            memory_mb,
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MigSpec>()?;
    m.add_class::<PartSpec>()?;
    m.add_class::<ShapeSpec>()?;
    m.add_class::<SlotShare>()?;
    Ok(())
}
