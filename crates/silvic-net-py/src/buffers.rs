//! Numpy arrays as the buffers of in-place collectives: the checks that make a bad array an
//! error before a byte is sent, and the read-only flag that keeps other Python threads off an
//! array while a collective runs on it (see the crate doc's Buffers).

use numpy::{Element, PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray};
use numpy::{PyReadwriteArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

/// Borrows `buf` as a writeable 1-D C-contiguous array of `T`, or says why it is not one.
pub(crate) fn writeable<'py, T: Element>(
    buf: &Bound<'py, PyAny>,
    op: &str,
    dtype: &str,
) -> PyResult<PyReadwriteArray1<'py, T>> {
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
    let typed = array.cast::<PyArray1<T>>()?;
    typed.try_readwrite().map_err(|e| match e {
        numpy::BorrowError::NotWriteable => {
            PyValueError::new_err(format!("{op} reduces in place and needs a writeable array"))
        }
        other => PyRuntimeError::new_err(format!("{op}: {other}")),
    })
}

/// Keeps an array read-only to Python while a collective runs on it, and makes it writeable
/// again when dropped, on every path out of the call. Made only for arrays found writeable.
pub(crate) struct ReadOnlyWhileInUse<'py> {
    flags: Bound<'py, PyAny>,
}

impl<'py> ReadOnlyWhileInUse<'py> {
    pub(crate) fn new(array: &Bound<'py, PyAny>) -> PyResult<Self> {
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
