//! Fixed-point histograms for Python: `FixedScale.agree` and `FixedHistogram`, the Rust types
//! over numpy arrays, whose sums depend on the samples alone (any world, partition or path).
//!
//! Invariants: a histogram adds a whole batch of (bin, value) pairs or none of them (a refused
//! value takes the batch back out, and is still told to every rank at the next `allreduce`, as
//! in Rust); arrays are checked (dtype, 1-D, contiguous, equal lengths) before a value is
//! added, and read with the GIL held (no other thread can resize them meanwhile); the GIL is
//! released during the collectives, which touch no Python memory.

use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use silvic_net::TrainerCollective;

use crate::buffers::readable;
use crate::errors;

/// The power-of-two quantum of a FixedHistogram, agreed by every rank from the data alone.
///
/// Make it with FixedScale.agree(ring, max_abs, rows) on every rank at once. Values are held
/// as whole numbers of quanta of 2**-exponent, rounded once each (to nearest, ties to even);
/// every value added must be below bound in magnitude; local_rows is this rank's row count.
#[pyclass(module = "silvic_net", frozen, eq)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct FixedScale {
    inner: silvic_net::FixedScale,
}

#[pymethods]
impl FixedScale {
    /// Agrees the scale with every rank of ring in one small collective: max_abs is the largest
    /// |value| this rank will add, rows the most values it will add to any one bin. The scale
    /// comes from the largest max and the sum of the rows, so it depends on the data alone.
    /// Raises CollectiveError (kind "invalid_argument" on every rank for a max that is not a
    /// finite number at least 0).
    #[staticmethod]
    fn agree(
        py: Python<'_>,
        ring: &Bound<'_, crate::TcpCollective>,
        max_abs: f64,
        rows: u64,
    ) -> PyResult<FixedScale> {
        let mut ring = ring.try_borrow_mut()?;
        let agreed = ring.collective(None, |inner| {
            crate::interrupt::detach(py, || silvic_net::FixedScale::agree(inner, max_abs, rows))?
                .map_err(|e| errors::collective(py, &e))
        })?;
        Ok(FixedScale { inner: agreed })
    }

    /// Values are held as whole numbers of quanta of 2**-exponent.
    #[getter]
    fn exponent(&self) -> i32 {
        self.inner.exponent()
    }

    /// Every value added must be below this in magnitude (a power of two, or infinity).
    #[getter]
    fn bound(&self) -> f64 {
        self.inner.bound()
    }

    /// The rows this rank declared: no bin's sum may pass what this many values could make.
    #[getter]
    fn local_rows(&self) -> u64 {
        self.inner.local_rows()
    }

    fn __repr__(&self) -> String {
        format!("FixedScale({}, local_rows={})", self.inner, self.inner.local_rows())
    }
}

/// Per-bin exact sums of per-sample values at an agreed FixedScale.
///
/// add(bins, values) per batch of samples, allreduce(ring) once on every rank, to_f64() for
/// the sums: one correct rounding of each bin's exact total, the same bits for any world or
/// partition of the samples.
#[pyclass(module = "silvic_net")]
#[derive(Debug)]
pub(crate) struct FixedHistogram {
    inner: silvic_net::FixedHistogram,
}

#[pymethods]
impl FixedHistogram {
    #[new]
    fn new(bins: usize, scale: &FixedScale) -> Self {
        FixedHistogram { inner: silvic_net::FixedHistogram::new(bins, scale.inner) }
    }

    /// The number of bins.
    #[getter]
    fn bins(&self) -> usize {
        self.inner.bins()
    }

    /// The scale the sums are held at.
    #[getter]
    fn scale(&self) -> FixedScale {
        FixedScale { inner: self.inner.scale() }
    }

    /// Adds values[i] (float64) to bin bins[i] (int64) for every i: all of them, or, if one is
    /// refused, none. Raises TypeError or ValueError for arrays that are not 1-D contiguous
    /// int64 and float64 of one length, and CollectiveError for a refused value (kind
    /// "overflow": not below the scale's bound, or past this rank's headroom;
    /// "invalid_argument": not finite, or a bin outside the histogram).
    fn add(
        &mut self,
        py: Python<'_>,
        bins: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let bins: PyReadonlyArray1<'_, i64> = readable(bins, "FixedHistogram.add bins", "int64")?;
        let values: PyReadonlyArray1<'_, f64> =
            readable(values, "FixedHistogram.add values", "float64")?;
        let (bins, values) = (bins.as_slice()?, values.as_slice()?);
        if bins.len() != values.len() {
            return Err(PyValueError::new_err(format!(
                "FixedHistogram.add got {} bins for {} values",
                bins.len(),
                values.len()
            )));
        }
        self.inner.add_many(bins, values).map_err(|e| errors::collective(py, &e))
    }

    /// Sums every bin over every rank of ring, exactly (one i128 allreduce; from 262,144 bins a
    /// small gather first, then the bins as i64s where their sums fit). Every rank calls
    /// it with the same number of bins. Raises CollectiveError on every rank alike where a rank
    /// holds another scale (kind "scale_mismatch"), refused a value (its kind), or the
    /// histogram was already reduced (kind "overflow"); the histogram is then emptied.
    fn allreduce(
        &mut self,
        py: Python<'_>,
        ring: &Bound<'_, crate::TcpCollective>,
    ) -> PyResult<()> {
        let mut ring = ring.try_borrow_mut()?;
        let hist = &mut self.inner;
        ring.collective(None, |ring| {
            crate::interrupt::detach(py, || hist.allreduce(ring))?
                .map_err(|e| errors::collective(py, &e))
        })
    }

    /// Each bin's sum as float64: one correct rounding of its exact total.
    fn to_f64<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        PyArray1::from_vec(py, self.inner.to_f64())
    }

    /// Each bin's exact sum in quanta of 2**-scale.exponent, as an (n, 2) int64 array of i128s:
    /// the low 64 bits, then the high ones (the layout ring.allreduce takes).
    fn sums<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray2<i64>> {
        let words: Vec<i64> = self.inner.sums().iter().flat_map(|&s| i128_words(s)).collect();
        let array = PyArray1::from_vec(py, words);
        array.reshape([self.inner.bins(), 2]).expect("2 words per bin")
    }

    fn __repr__(&self) -> String {
        format!("FixedHistogram({} bins, {})", self.inner.bins(), self.inner.scale())
    }
}

/// An i128 as the two int64 words it lies in, low first.
fn i128_words(x: i128) -> [i64; 2] {
    [x as i64, (x >> 64) as i64]
}

/// Reduces `words`, i128s as pairs of int64 words (low first), with `reduction`: through an
/// `i128` copy, as a slice of `i64` need not be aligned for `i128`.
pub(crate) fn allreduce_i128(
    ring: &mut silvic_net::TcpCollective,
    words: &mut [i64],
    reduction: silvic_net::Reduction,
) -> Result<(), silvic_net::CollectiveError> {
    let mut wide: Vec<i128> = words.chunks_exact(2).map(|w| bytemuck::cast([w[0], w[1]])).collect();
    ring.allreduce(silvic_net::Numbers::I128(&mut wide), reduction)?;
    for (w, x) in words.chunks_exact_mut(2).zip(wide) {
        w.copy_from_slice(&i128_words(x));
    }
    Ok(())
}
