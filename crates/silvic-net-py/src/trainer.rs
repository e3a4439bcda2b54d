//! The trainers' op set ([`silvic_net::TrainerCollective`]) for Python: typed allreduces of
//! numpy arrays, the record reduce-scatter and allreduce with a Python fold, the
//! variable-length allgather and the broadcast, over bytes.
//!
//! Invariants: arguments are checked before a byte is sent, as for the pinned allreduces (an
//! array of another dtype, shape or layout raises `TypeError` or `ValueError`; a reduction
//! other than "sum", "min" or "max" raises `ValueError`). The GIL is released during every
//! collective and taken back only to call a Python fold, once per run of records. A fold that
//! raises, or returns anything but bytes of its accumulator's length, cannot stop the ring
//! (every rank must keep in step): the accumulator is left as it was, later runs are not
//! folded, and the first such error is raised when the call returns.

use std::sync::Mutex;

use numpy::{Element, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use silvic_net::{
    Collective, CollectiveError, Dtype, Numbers, Op, Reduction, TcpCollective, TrainerCollective,
};

use crate::buffers::{InPlace, reduce_in_place};
use crate::errors::{self, Unit};

fn reduction(op: &str) -> PyResult<Reduction> {
    match op {
        "sum" => Ok(Reduction::Sum),
        "min" => Ok(Reduction::Min),
        "max" => Ok(Reduction::Max),
        other => Err(PyValueError::new_err(format!(
            "allreduce takes op \"sum\", \"min\" or \"max\", got {other:?}"
        ))),
    }
}

fn typed<T: Element + Copy + Send>(
    ring: &mut TcpCollective,
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    dtype: &'static str,
    reduction: Reduction,
    numbers: fn(&mut [T]) -> Numbers<'_>,
) -> PyResult<()> {
    let op = Op::allreduce(reduction, numbers(&mut []).dtype());
    let call = InPlace { name: "allreduce", dtype, op };
    reduce_in_place(ring, py, buf, call, |ring, work| ring.allreduce(numbers(work), reduction))
}

/// `ring.allreduce(buf, op)` of an `(n, 2)` int64 array, `n` i128s (low word first): reduced
/// as the 1-D arrays are ([`reduce_in_place`]), through a flat view of its words.
fn wide(
    ring: &mut TcpCollective,
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    reduction: Reduction,
) -> PyResult<()> {
    let array = buf.cast::<PyUntypedArray>()?;
    if !array.is_c_contiguous() {
        return Err(PyValueError::new_err(
            "allreduce needs a contiguous (n, 2) int64 array, got a strided view (pass \
             numpy.ascontiguousarray(a) and read the result from it)",
        ));
    }
    // A C-contiguous array's flat reshape is a view of the same memory, never a copy.
    let flat = buf.call_method1("reshape", (-1,))?;
    let op = Op::allreduce(reduction, Dtype::I128);
    let call = InPlace { name: "allreduce", dtype: "int64", op };
    reduce_in_place(ring, py, &flat, call, |ring, words: &mut [i64]| {
        crate::fixed::allreduce_i128(ring, words, reduction)
    })
}

/// The elements `ring.allreduce(buf, op)` counts in its errors: `buf`'s dtype, where it is one
/// [`allreduce`] takes (an `(n, 2)` int64 array counts its int64 words, `2n`).
pub(crate) fn unit(py: Python<'_>, buf: &Bound<'_, PyAny>) -> Option<Unit> {
    let array = buf.cast::<PyUntypedArray>().ok()?;
    let dtype = array.dtype();
    let is = |d: Bound<'_, numpy::PyArrayDescr>| dtype.is_equiv_to(&d);
    let (name, width) = if is(f32::get_dtype(py)) {
        ("float32", 4)
    } else if is(f64::get_dtype(py)) {
        ("float64", 8)
    } else if is(i32::get_dtype(py)) {
        ("int32", 4)
    } else if is(i64::get_dtype(py)) {
        ("int64", 8)
    } else if is(u64::get_dtype(py)) {
        ("uint64", 8)
    } else {
        return None;
    };
    Some(Unit { dtype: name, width })
}

/// `ring.allreduce(buf, op)`: `buf` a float32, float64, int32, int64 or uint64 array, or an
/// `(n, 2)` int64 array of i128s.
pub(crate) fn allreduce(
    ring: &mut TcpCollective,
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    op: &str,
) -> PyResult<()> {
    let reduction = reduction(op)?;
    let Ok(array) = buf.cast::<PyUntypedArray>() else {
        return Err(PyTypeError::new_err(format!(
            "allreduce needs a 1-D numpy array of float32, float64, int32, int64 or uint64, got {}",
            buf.get_type().name()?
        )));
    };
    let dtype = array.dtype();
    let is = |d: Bound<'_, numpy::PyArrayDescr>| dtype.is_equiv_to(&d);
    if array.ndim() == 2 && array.shape()[1] == 2 && is(i64::get_dtype(py)) {
        wide(ring, py, buf, reduction)
    } else if is(f32::get_dtype(py)) {
        typed(ring, py, buf, "float32", reduction, |s: &mut [f32]| Numbers::F32(s))
    } else if is(f64::get_dtype(py)) {
        typed(ring, py, buf, "float64", reduction, |s: &mut [f64]| Numbers::F64(s))
    } else if is(i32::get_dtype(py)) {
        typed(ring, py, buf, "int32", reduction, |s: &mut [i32]| Numbers::I32(s))
    } else if is(i64::get_dtype(py)) {
        typed(ring, py, buf, "int64", reduction, |s: &mut [i64]| Numbers::I64(s))
    } else if is(u64::get_dtype(py)) {
        typed(ring, py, buf, "uint64", reduction, |s: &mut [u64]| Numbers::U64(s))
    } else {
        Err(PyTypeError::new_err(format!(
            "allreduce needs dtype float32, float64, int32, int64 or uint64, got dtype {}",
            dtype.str()?
        )))
    }
}

/// A Python callable as a record fold, keeping the first error it raises.
struct PythonFold {
    fold: Py<PyAny>,
    failed: Mutex<Option<PyErr>>,
}

impl PythonFold {
    fn call(&self, acc: &mut [u8], next: &[u8]) {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        if failed.is_some() {
            return;
        }
        Python::attach(|py| {
            let result = self.fold.call1(py, (PyBytes::new(py, acc), PyBytes::new(py, next)));
            let folded = result.and_then(|r| {
                let bytes = r.bind(py).cast::<PyBytes>().map_err(PyErr::from)?.as_bytes().to_vec();
                if bytes.len() != acc.len() {
                    return Err(PyValueError::new_err(format!(
                        "the fold returned {} bytes for a {}-byte accumulator",
                        bytes.len(),
                        acc.len()
                    )));
                }
                Ok(bytes)
            });
            match folded {
                Ok(bytes) => acc.copy_from_slice(&bytes),
                Err(e) => *failed = Some(e),
            }
        });
    }

    /// The collective's result, or the fold's first error, or the collective's.
    fn finish<R>(self, py: Python<'_>, result: Result<R, CollectiveError>) -> PyResult<R> {
        let failed = self.failed.into_inner().unwrap_or_else(|e| e.into_inner());
        match (failed, result) {
            (Some(error), _) => Err(error),
            (None, result) => result.map_err(|e| errors::collective(py, &e)),
        }
    }
}

/// `ring.reduce_scatter_records(data, blocks, record, fold)`: this rank's folded block.
pub(crate) fn reduce_scatter_records<'py>(
    ring: &mut TcpCollective,
    py: Python<'py>,
    data: &[u8],
    blocks: Vec<usize>,
    record: usize,
    fold: Py<PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut buf = data.to_vec();
    let python = PythonFold { fold, failed: Mutex::new(None) };
    let result = crate::interrupt::detach(py, || {
        let fold = |acc: &mut [u8], next: &[u8]| python.call(acc, next);
        ring.reduce_scatter_records(&mut buf, &blocks, record, &fold)
    })?;
    python.finish(py, result)?;
    let start: usize = blocks[..ring.rank()].iter().sum();
    Ok(PyBytes::new(py, &buf[start..start + blocks[ring.rank()]]))
}

/// `ring.allreduce_records(data, record, fold)`: the folded records.
pub(crate) fn allreduce_records<'py>(
    ring: &mut TcpCollective,
    py: Python<'py>,
    data: &[u8],
    record: usize,
    fold: Py<PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut buf = data.to_vec();
    let python = PythonFold { fold, failed: Mutex::new(None) };
    let result = crate::interrupt::detach(py, || {
        let fold = |acc: &mut [u8], next: &[u8]| python.call(acc, next);
        ring.allreduce_records(&mut buf, record, &fold)
    })?;
    python.finish(py, result)?;
    Ok(PyBytes::new(py, &buf))
}

/// `ring.allgather_varlen(local)`: every rank's bytes, by rank.
pub(crate) fn allgather_varlen<'py>(
    ring: &mut TcpCollective,
    py: Python<'py>,
    local: &[u8],
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let blocks = crate::interrupt::detach(py, || ring.allgather_varlen(local))?
        .map_err(|e| errors::collective(py, &e))?;
    Ok(blocks.iter().map(|block| PyBytes::new(py, block)).collect())
}

/// `ring.allgather_blocks(local, blocks)`: every rank's block, end to end.
pub(crate) fn allgather_blocks<'py>(
    ring: &mut TcpCollective,
    py: Python<'py>,
    local: &[u8],
    blocks: Vec<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    let total = blocks.iter().try_fold(0usize, |sum, &b| sum.checked_add(b));
    let mine = blocks.get(ring.rank()).copied().filter(|_| blocks.len() == ring.world_size());
    let (Some(total), Some(mine)) = (total, mine) else {
        return Err(PyValueError::new_err(format!(
            "allgather_blocks needs one block length per rank ({}), got {}",
            ring.world_size(),
            blocks.len()
        )));
    };
    if local.len() != mine {
        return Err(PyValueError::new_err(format!(
            "allgather_blocks: this rank's block is {mine} bytes, local is {}",
            local.len()
        )));
    }
    let start: usize = blocks[..ring.rank()].iter().sum();
    let mut buf = vec![0u8; total];
    buf[start..start + mine].copy_from_slice(local);
    crate::interrupt::detach(py, || ring.allgather_blocks(&mut buf, &blocks))?
        .map_err(|e| errors::collective(py, &e))?;
    Ok(PyBytes::new(py, &buf))
}

/// `ring.broadcast_bytes(data, root)`: root's bytes.
pub(crate) fn broadcast_bytes<'py>(
    ring: &mut TcpCollective,
    py: Python<'py>,
    data: &[u8],
    root: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut buf = data.to_vec();
    crate::interrupt::detach(py, || ring.broadcast_bytes(&mut buf, root))?
        .map_err(|e| errors::collective(py, &e))?;
    Ok(PyBytes::new(py, &buf))
}
