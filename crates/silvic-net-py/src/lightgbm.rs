//! LightGBM's network over a silvic-net ring: the Rust half of the two hooks LightGBM's C API
//! takes (`LGBM_NetworkInitWithFunctions(num_machines, rank, reduce_scatter, allgather)`), and
//! the lending of a ring to them for a `with silvic_net.lightgbm.network(ring):` block.
//!
//! The hooks take no user data and run without the GIL (ctypes releases it around every
//! LightGBM call), so the ring they use is process-global: `_lightgbm_lend` moves it out of its
//! Python object into [`ACTIVE`] for the block, and `_lightgbm_return` moves it back. Meanwhile
//! the Python object refuses every call (it has no ring), so nothing but LightGBM uses it.
//!
//! Invariants at the boundary (src/lightgbm_shim.cpp calls the two `extern "C"` functions):
//! every length and block layout LightGBM passes is checked before a slice is made of it, each
//! against the ring's world size and the buffer it describes; an error, and a panic caught
//! here, become a message returned to C++, which throws it as `std::runtime_error` (LightGBM's
//! C API turns that into `LightGBMError`). Nothing unwinds across the boundary, and nothing
//! aborts or exits.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use silvic_net::{Collective, TrainerCollective};

/// The ring LightGBM's hooks use while a `network` block runs.
static ACTIVE: Mutex<Option<silvic_net::TcpCollective>> = Mutex::new(None);

fn active() -> MutexGuard<'static, Option<silvic_net::TcpCollective>> {
    ACTIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The error of a Python call on a ring that LightGBM holds.
pub(crate) fn lent() -> PyErr {
    PyRuntimeError::new_err(
        "this ring is LightGBM's network until its `with silvic_net.lightgbm.network(ring):` \
         block ends",
    )
}

unsafe extern "C" {
    /// The address of the C++ reduce-scatter hook (src/lightgbm_shim.cpp).
    fn silvic_lgbm_reduce_scatter_hook() -> *mut c_void;
    /// The address of the C++ allgather hook.
    fn silvic_lgbm_allgather_hook() -> *mut c_void;
}

/// Moves `ring` into the hooks' global slot; returns its rank, its world size and the two hook
/// addresses to hand to `LGBM_NetworkInitWithFunctions`.
#[pyfunction]
fn _lightgbm_lend(
    ring: &Bound<'_, crate::TcpCollective>,
) -> PyResult<(usize, usize, usize, usize)> {
    let mut slot = active();
    if slot.is_some() {
        return Err(PyRuntimeError::new_err(
            "another ring is LightGBM's network already: one silvic_net.lightgbm.network block \
             at a time per process",
        ));
    }
    let mut this = ring.try_borrow_mut()?;
    let inner = this.inner.take().ok_or_else(lent)?;
    let (rank, world) = (inner.rank(), inner.world_size());
    *slot = Some(inner);
    // SAFETY: both functions only return the address of a function defined in the shim.
    let hooks = unsafe { (silvic_lgbm_reduce_scatter_hook(), silvic_lgbm_allgather_hook()) };
    Ok((rank, world, hooks.0 as usize, hooks.1 as usize))
}

/// Moves the lent ring back into `ring` (a no-op if none is lent).
#[pyfunction]
fn _lightgbm_return(ring: &Bound<'_, crate::TcpCollective>) -> PyResult<()> {
    let taken = active().take();
    if let Some(inner) = taken {
        ring.try_borrow_mut()?.inner = Some(inner);
    }
    Ok(())
}

/// Adds the lending functions to the native module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_lightgbm_lend, m)?)?;
    m.add_function(wrap_pyfunction!(_lightgbm_return, m)?)?;
    Ok(())
}

/// LightGBM's `ReduceFunction`: folds `array_size` bytes of `input` into `output`, record by
/// record (`output = output ⊕ input`).
type Reducer = Option<unsafe extern "C" fn(*const c_char, *mut c_char, c_int, i32)>;

/// A length LightGBM passed, refused if negative.
fn length(what: &str, value: i32) -> Result<usize, String> {
    usize::try_from(value).map_err(|_| format!("LightGBM passed a negative {what}: {value}"))
}

/// The block lengths of a layout LightGBM passed, checked: one per rank of `world`, each block
/// starting where the one before ends, from 0, adding up to `total` bytes.
fn layout(starts: &[i32], lens: &[i32], world: usize, total: usize) -> Result<Vec<usize>, String> {
    if starts.len() != world {
        return Err(format!(
            "LightGBM passed {} blocks to a ring of {world} ranks (num_machines must be the \
             ring's world size)",
            starts.len()
        ));
    }
    let mut at = 0usize;
    let mut blocks = Vec::with_capacity(world);
    for (rank, (&start, &len)) in starts.iter().zip(lens).enumerate() {
        let (start, len) = (length("block start", start)?, length("block length", len)?);
        if start != at {
            return Err(format!("LightGBM's block {rank} starts at {start}, not at {at}"));
        }
        at += len;
        blocks.push(len);
    }
    if at != total {
        return Err(format!("LightGBM's blocks add up to {at} bytes, its buffer is {total}"));
    }
    Ok(blocks)
}

/// Runs `body` with the lent ring, or says there is none.
fn with_ring<R>(
    body: impl FnOnce(&mut silvic_net::TcpCollective) -> Result<R, String>,
) -> Result<R, String> {
    let mut slot = active();
    let ring = slot.as_mut().ok_or_else(|| {
        "no silvic-net ring is LightGBM's network here: call lgb.train inside \
         `with silvic_net.lightgbm.network(ring):`"
            .to_string()
    })?;
    body(ring)
}

fn failed(error: silvic_net::CollectiveError) -> String {
    format!("silvic-net: {error}")
}

/// The message C++ throws: `None` is success. A panic's text is caught here.
fn report(outcome: std::thread::Result<Result<(), String>>) -> *const c_char {
    let message = match outcome {
        Ok(Ok(())) => return std::ptr::null(),
        Ok(Err(message)) => message,
        Err(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            format!("silvic-net: internal error in a LightGBM network hook: {text}")
        }
    };
    let message = CString::new(message.replace('\0', "\\0")).expect("no NUL left");
    message.into_raw()
}

/// Frees a message [`report`] returned.
///
/// # Safety
///
/// `message` is null or a pointer [`report`] returned, not freed before.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn silvic_lgbm_free_message(message: *const c_char) {
    if !message.is_null() {
        // SAFETY: the caller passes a pointer of `CString::into_raw`, once.
        drop(unsafe { CString::from_raw(message.cast_mut()) });
    }
}

/// LightGBM's reduce-scatter hook: folds `input`'s blocks over the ring with `reducer`, and
/// writes this rank's folded block to the start of `output`. Returns null, or an error message
/// for [`silvic_lgbm_free_message`].
///
/// # Safety
///
/// The pointers are LightGBM's: `input` holds `input_size` bytes, `output` `output_size`,
/// `block_start` and `block_len` `num_block` integers each, and `reducer` folds as its
/// `ReduceFunction` does.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // LightGBM's signature
pub(crate) unsafe extern "C" fn silvic_lgbm_reduce_scatter(
    input: *mut c_char,
    input_size: i32,
    type_size: c_int,
    block_start: *const i32,
    block_len: *const i32,
    num_block: c_int,
    output: *mut c_char,
    output_size: i32,
    reducer: Reducer,
) -> *const c_char {
    report(catch_unwind(AssertUnwindSafe(|| {
        let (input_size, output_size) =
            (length("input size", input_size)?, length("output size", output_size)?);
        let record = length("record size", type_size)?;
        let count = length("block count", num_block)?;
        let reducer = reducer.ok_or("LightGBM passed no reducer")?;
        // SAFETY: LightGBM's arrays of `num_block` integers (the caller's promise).
        let (starts, lens) =
            unsafe { (slice(block_start.cast(), count * 4), slice(block_len.cast(), count * 4)) };
        let (starts, lens) = (integers(starts), integers(lens));
        // LightGBM's input is scratch (its own reduce-scatters fold into it), so the ring folds
        // in place, unless the output overlaps it.
        let (from, to) = (input as usize, output as usize);
        let disjoint = from + input_size <= to || to + output_size <= from;
        let mut copy = Vec::new();
        let work: &mut [u8] = if disjoint {
            // SAFETY: `input_size` bytes of LightGBM's input, apart from its output.
            unsafe { slice_mut(input.cast(), input_size) }
        } else {
            // SAFETY: `input_size` bytes of LightGBM's input, copied before `output` is written.
            copy.extend_from_slice(unsafe { slice(input.cast(), input_size) });
            &mut copy
        };
        with_ring(|ring| {
            let (rank, world) = (ring.rank(), ring.world_size());
            let blocks = layout(&starts, &lens, world, input_size)?;
            if blocks[rank] > output_size {
                return Err(format!(
                    "LightGBM's output of {output_size} bytes cannot hold block {rank} of {} bytes",
                    blocks[rank]
                ));
            }
            let fold = |acc: &mut [u8], next: &[u8]| {
                // SAFETY: LightGBM's reducer over two runs of `acc.len()` bytes of whole records
                // (acc.len() is at most input_size, an i32).
                unsafe {
                    reducer(
                        next.as_ptr().cast(),
                        acc.as_mut_ptr().cast(),
                        type_size,
                        acc.len() as i32,
                    )
                }
            };
            ring.reduce_scatter_records(work, &blocks, record, &fold).map_err(failed)?;
            let start: usize = blocks[..rank].iter().sum();
            // SAFETY: `output_size` bytes of LightGBM's output, no other reference alive.
            let out = unsafe { slice_mut(output.cast(), output_size) };
            out[..blocks[rank]].copy_from_slice(&work[start..start + blocks[rank]]);
            Ok(())
        })
    })))
}

/// LightGBM's allgather hook: every rank's block of `block_len` bytes, at its `block_start`
/// in `output`. Returns null, or an error message for [`silvic_lgbm_free_message`].
///
/// # Safety
///
/// As [`silvic_lgbm_reduce_scatter`]: `input` holds `input_size` bytes (this rank's block; it
/// may lie inside `output`), `output` `output_size`, the arrays `num_block` integers each.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn silvic_lgbm_allgather(
    input: *mut c_char,
    input_size: i32,
    block_start: *const i32,
    block_len: *const i32,
    num_block: c_int,
    output: *mut c_char,
    output_size: i32,
) -> *const c_char {
    report(catch_unwind(AssertUnwindSafe(|| {
        let (input_size, output_size) =
            (length("input size", input_size)?, length("output size", output_size)?);
        let count = length("block count", num_block)?;
        // SAFETY: LightGBM's arrays of `num_block` integers.
        let (starts, lens) =
            unsafe { (slice(block_start.cast(), count * 4), slice(block_len.cast(), count * 4)) };
        let (starts, lens) = (integers(starts), integers(lens));
        // SAFETY: `input_size` bytes of LightGBM's input, copied before `output` is written
        // (LightGBM's allreduce passes a block that lies inside `output`).
        let local = unsafe { slice(input.cast(), input_size) }.to_vec();
        with_ring(|ring| {
            let (rank, world) = (ring.rank(), ring.world_size());
            let blocks = layout(&starts, &lens, world, output_size)?;
            if blocks[rank] != input_size {
                return Err(format!(
                    "LightGBM passed {input_size} bytes for block {rank} of {} bytes",
                    blocks[rank]
                ));
            }
            // SAFETY: `output_size` bytes of LightGBM's output; `local` is a copy.
            let out = unsafe { slice_mut(output.cast(), output_size) };
            let start: usize = blocks[..rank].iter().sum();
            out[start..start + input_size].copy_from_slice(&local);
            ring.allgather_blocks(out, &blocks).map_err(failed)
        })
    })))
}

/// The native-endian `i32`s of one of LightGBM's arrays, read from its bytes (which need not
/// be aligned for Rust's sake: LightGBM's are, but a copy costs nothing here).
fn integers(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().expect("4 bytes"))).collect()
}

/// `len` bytes at `at` (none for a zero length, whatever the pointer).
///
/// # Safety
///
/// `at` points to `len` readable bytes, unchanged while the slice lives.
unsafe fn slice<'a>(at: *const u8, len: usize) -> &'a [u8] {
    if len == 0 || at.is_null() {
        return &[];
    }
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(at, len) }
}

/// `len` writable bytes at `at`.
///
/// # Safety
///
/// `at` points to `len` writable bytes that nothing else reads or writes while the slice lives.
unsafe fn slice_mut<'a>(at: *mut u8, len: usize) -> &'a mut [u8] {
    if len == 0 || at.is_null() {
        return &mut [];
    }
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts_mut(at, len) }
}
