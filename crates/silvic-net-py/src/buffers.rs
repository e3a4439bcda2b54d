//! Numpy arrays as the buffers of in-place collectives: the checks that make a bad array an
//! error before a byte is sent, and [`reduce_in_place`], which runs the collective on a copy
//! (see the crate doc's Buffers).
//!
//! Invariants: the ring never reads or writes a numpy array's memory without the GIL. Numpy
//! lets other Python threads free that memory (`a.resize(n, refcheck=False)`, which a buffer
//! export does not prevent) or write it through another view at any moment, so the collective
//! runs on a copy taken with the GIL held, and the result goes back only into the very memory
//! the copy came from; an array resized or replaced meanwhile gets no result, and the call
//! fails on every rank instead, so no rank goes on with a result the others have and it lacks.

use numpy::{Element, PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray};
use numpy::{PyReadonlyArray1, PyReadwriteArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use silvic_net::{CollectiveError, Op, TcpCollective};

use crate::errors;

/// What one in-place reduction is, for its checks and messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InPlace<'a> {
    /// The method's name, as errors give it.
    pub(crate) name: &'a str,
    /// The dtype it takes, as errors give it.
    pub(crate) dtype: &'static str,
    /// The collective, for the ring's record of a call that fails.
    pub(crate) op: Op,
}

/// Reduces `buf`, a writeable 1-D C-contiguous numpy array of `T`, across `ring` with
/// `reduce`, in place as far as Python sees: `reduce` runs without the GIL on a copy of the
/// array, and the result is written back with the GIL held. While it runs the array is
/// read-only to Python (a write through it raises `ValueError`); writes through another view
/// are overwritten by the result. An array resized or replaced meanwhile (its memory is not
/// the memory copied) gets nothing: the call fails, here and on every other rank
/// ([`TcpCollective::refuse`]), and the ring is closed. Bad arrays raise before a byte is sent.
pub(crate) fn reduce_in_place<T: Element + Copy + Send>(
    ring: &mut TcpCollective,
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    call: InPlace<'_>,
    reduce: impl FnOnce(&mut TcpCollective, &mut [T]) -> Result<(), CollectiveError> + Send,
) -> PyResult<()> {
    let (at, mut work) = {
        let array = writeable::<T>(buf, call.name, call.dtype)?;
        let slice = contiguous(&array, call.name)?;
        (slice.as_ptr() as usize, slice.to_vec())
    };
    let read_only = ReadOnlyWhileInUse::new(buf)?;
    let reduced = crate::interrupt::detach(py, || reduce(ring, &mut work));
    drop(read_only);
    reduced?.map_err(|e| errors::collective(py, &e))?;
    let placed = writeable::<T>(buf, call.name, call.dtype).ok().and_then(|mut array| {
        let slice = array.as_slice_mut().ok()?;
        let same = slice.as_ptr() as usize == at && slice.len() == work.len();
        same.then(|| slice.copy_from_slice(&work))
    });
    if placed.is_none() {
        let error = ring.refuse(
            call.op,
            format!(
                "the array was resized or replaced while {} ran on it: its result is lost, and \
                 the ring is closed",
                call.name
            ),
        );
        return Err(errors::collective(py, &error));
    }
    Ok(())
}

fn contiguous<'a, T: Element>(array: &'a PyReadwriteArray1<'_, T>, op: &str) -> PyResult<&'a [T]> {
    array
        .as_slice()
        .map_err(|e| PyValueError::new_err(format!("{op} needs a contiguous array: {e}")))
}

/// Borrows `buf` as a writeable 1-D C-contiguous array of `T`, or says why it is not one.
fn writeable<'py, T: Element>(
    buf: &Bound<'py, PyAny>,
    op: &str,
    dtype: &str,
) -> PyResult<PyReadwriteArray1<'py, T>> {
    let typed = one_dimensional::<T>(buf, op, dtype)?;
    typed.try_readwrite().map_err(|e| match e {
        numpy::BorrowError::NotWriteable => PyValueError::new_err(format!(
            "{op} reduces in place and needs a writeable array, and this one is read-only \
                 (as Ray hands actors their arguments): pass a copy, `array = array.copy()`"
        )),
        other => PyRuntimeError::new_err(format!("{op}: {other}")),
    })
}

/// Borrows `buf` as a 1-D C-contiguous array of `T` to read, or says why it is not one.
pub(crate) fn readable<'py, T: Element>(
    buf: &Bound<'py, PyAny>,
    op: &str,
    dtype: &str,
) -> PyResult<PyReadonlyArray1<'py, T>> {
    let typed = one_dimensional::<T>(buf, op, dtype)?;
    typed.try_readonly().map_err(|e| PyRuntimeError::new_err(format!("{op}: {e}")))
}

/// `buf` as a 1-D C-contiguous array of `T`, or why it is not one.
fn one_dimensional<'py, T: Element>(
    buf: &Bound<'py, PyAny>,
    op: &str,
    dtype: &str,
) -> PyResult<Bound<'py, PyArray1<T>>> {
    let Ok(array) = buf.cast::<PyUntypedArray>() else {
        return Err(PyTypeError::new_err(format!(
            "{op} needs a 1-D numpy array of {dtype}, got {}",
            buf.get_type().name()?
        )));
    };
    let got = array.dtype();
    if !got.is_equiv_to(&T::get_dtype(buf.py())) {
        return Err(PyTypeError::new_err(format!(
            "{op} needs a numpy array of dtype {dtype}, got dtype {}",
            got.str()?
        )));
    }
    if array.ndim() != 1 {
        return Err(PyValueError::new_err(format!(
            "{op} needs a 1-D array, got {} dimensions (pass a.reshape(-1) of a C-contiguous array)",
            array.ndim()
        )));
    }
    if !array.is_c_contiguous() {
        return Err(PyValueError::new_err(format!(
            "{op} needs a contiguous array, got a strided view (pass numpy.ascontiguousarray(a) \
             and read the result from it)"
        )));
    }
    Ok(array.cast::<PyArray1<T>>()?.clone())
}

/// Keeps an array read-only to Python while a collective runs on it, and makes it writeable
/// again when dropped, on every path out of the call. Made only for arrays found writeable.
struct ReadOnlyWhileInUse<'py> {
    flags: Bound<'py, PyAny>,
}

impl<'py> ReadOnlyWhileInUse<'py> {
    fn new(array: &Bound<'py, PyAny>) -> PyResult<Self> {
        let flags = array.getattr("flags")?;
        flags.setattr("writeable", false)?;
        Ok(ReadOnlyWhileInUse { flags })
    }
}

impl Drop for ReadOnlyWhileInUse<'_> {
    fn drop(&mut self) {
        // The array was writeable when the call began, so this fails only if another thread
        // took its base's write access away meanwhile: report it, as a destructor can.
        if let Err(e) = self.flags.setattr("writeable", true) {
            e.write_unraisable(self.flags.py(), Some(&self.flags));
        }
    }
}
