//! LightGBM's network over a silvic-net ring: the Rust half of the two hooks LightGBM's C API
//! takes (`LGBM_NetworkInitWithFunctions(num_machines, rank, reduce_scatter, allgather)`), and
//! the lending of a ring to them for a `with silvic_net.lightgbm.network(ring):` block.
//!
//! The hooks take no user data and run without the GIL (ctypes releases it around every
//! LightGBM call), so the ring they use is process-global: `_lightgbm_lend` moves it out of its
//! Python object into [`ACTIVE`] for the block, and `_lightgbm_return` moves it back into the
//! object it came from. Meanwhile the Python object refuses every call (it has no ring), so
//! nothing but LightGBM uses it.
//!
//! Invariants at the boundary (src/lightgbm_shim.cpp calls the two `extern "C"` functions):
//! - Every length, pointer and block layout LightGBM passes is checked before a slice is made
//!   of it and before any byte moves: the block count against the ring's world size before the
//!   block arrays are read, each pointer non-null where its length is not zero, the layout
//!   against the buffer it describes. A bad argument fails the call on every rank
//!   ([`silvic_net::TcpCollective::refuse`]): this rank's LightGBM raises, and the other ranks'
//!   raise naming this one, rather than wait for a rank that never joins the call.
//! - An error, and a panic caught here, become a message returned to C++, which throws it as
//!   `std::runtime_error` (LightGBM's C API turns that into `LightGBMError`). Nothing unwinds
//!   across the boundary, and nothing aborts or exits.
//! - The lent ring goes back only to the Python object it came from, and only once that object
//!   can take it (not borrowed elsewhere); otherwise it stays lent and the return says why. No
//!   lock is waited on with the GIL held: a hook holds [`ACTIVE`] for a whole collective.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard, TryLockError};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use silvic_net::{Collective, Op, TrainerCollective};

/// A ring lent to LightGBM, and the Python object it was lent by (its address, which stays its
/// own while the `with` block holds it).
#[derive(Debug)]
struct Lent {
    ring: silvic_net::TcpCollective,
    lender: usize,
}

/// The ring LightGBM's hooks use while a `network` block runs.
static ACTIVE: Mutex<Option<Lent>> = Mutex::new(None);

/// What a signal handler raised in a hook whose collective it cancelled (`KeyboardInterrupt`
/// for Ctrl-C), until `network` takes it to raise in place of LightGBM's error.
static SIGNALLED: Mutex<Option<PyErr>> = Mutex::new(None);

/// The slot, waiting for a hook that holds it (never with the GIL: see the callers).
fn active() -> MutexGuard<'static, Option<Lent>> {
    ACTIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The error of a Python call on a ring that LightGBM holds.
pub(crate) fn lent() -> PyErr {
    PyRuntimeError::new_err(
        "this ring is LightGBM's network until its `with silvic_net.lightgbm.network(ring):` \
         block ends",
    )
}

fn another_block() -> PyErr {
    PyRuntimeError::new_err(
        "another ring is LightGBM's network already: one silvic_net.lightgbm.network block at a \
         time per process",
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
    // A hook holds the slot for a whole collective, and one runs only while a ring is lent:
    // a slot that is held means another block, and is not waited for with the GIL held.
    let mut slot = match ACTIVE.try_lock() {
        Ok(slot) => slot,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => return Err(another_block()),
    };
    if slot.is_some() {
        return Err(another_block());
    }
    let mut this = ring.try_borrow_mut()?;
    let inner = this.inner.take().ok_or_else(lent)?;
    let (rank, world) = (inner.rank(), inner.world_size());
    *slot = Some(Lent { ring: inner, lender: ring.as_ptr() as usize });
    // SAFETY: both functions only return the address of a function defined in the shim.
    let hooks = unsafe { (silvic_lgbm_reduce_scatter_hook(), silvic_lgbm_allgather_hook()) };
    Ok((rank, world, hooks.0 as usize, hooks.1 as usize))
}

/// Moves the lent ring back into `ring`, the object it was lent by (a no-op if none is lent).
/// Refuses, leaving the ring lent, if `ring` is not that object or cannot be taken now.
#[pyfunction]
fn _lightgbm_return(ring: &Bound<'_, crate::TcpCollective>) -> PyResult<()> {
    // Borrowed first: a ring taken out of the slot and then not placed would be dropped, and
    // so closed.
    let mut this = ring.try_borrow_mut()?;
    // A hook on another thread may hold the slot for a whole collective: wait without the GIL.
    let lender = ring.as_ptr() as usize;
    let taken = ring.py().detach(|| {
        let mut slot = active();
        match slot.take() {
            Some(lent) if lent.lender != lender => {
                *slot = Some(lent);
                Err(())
            }
            other => Ok(other.map(|lent| lent.ring)),
        }
    });
    match taken {
        Ok(Some(inner)) => {
            this.inner = Some(inner);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(()) => Err(PyRuntimeError::new_err(
            "this is not the ring LightGBM's network was lent: give back the ring the \
             `with silvic_net.lightgbm.network(ring):` block was given",
        )),
    }
}

/// Adds the lending functions to the native module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_lightgbm_lend, m)?)?;
    m.add_function(wrap_pyfunction!(_lightgbm_return, m)?)?;
    m.add_function(wrap_pyfunction!(_lightgbm_take_signal, m)?)?;
    Ok(())
}

/// LightGBM's `ReduceFunction`: folds `array_size` bytes of `input` into `output`, record by
/// record (`output = output ⊕ input`).
type Reducer = Option<unsafe extern "C" fn(*const c_char, *mut c_char, c_int, i32)>;

/// Why a hook's call failed: LightGBM's arguments (refused on every rank before anything
/// moves), or the collective itself (which has failed the ring already).
enum Failure {
    Arguments(String),
    Collective(silvic_net::CollectiveError),
}

impl From<String> for Failure {
    fn from(reason: String) -> Failure {
        Failure::Arguments(reason)
    }
}

/// A length LightGBM passed, refused if negative.
fn length(what: &str, value: i32) -> Result<usize, String> {
    usize::try_from(value).map_err(|_| format!("LightGBM passed a negative {what}: {value}"))
}

/// Refuses a null pointer LightGBM passed for `len` bytes of `what`, where `len` is not zero.
fn non_null<T>(what: &str, at: *const T, len: usize) -> Result<(), String> {
    if at.is_null() && len > 0 {
        return Err(format!("LightGBM passed a null {what} of {len} bytes"));
    }
    Ok(())
}

/// The block count LightGBM passed, which must be the ring's world size: checked before the
/// block arrays (`num_block` integers each) are read.
fn block_count(num_block: c_int, world: usize) -> Result<usize, String> {
    let count = length("block count", num_block)?;
    if count != world {
        return Err(format!(
            "LightGBM passed {count} blocks to a ring of {world} ranks (num_machines must be the \
             ring's world size)"
        ));
    }
    Ok(count)
}

/// The block lengths of a layout LightGBM passed, checked: each block starting where the one
/// before ends, from 0, adding up to `total` bytes. `starts` and `lens` are one per rank.
fn layout(starts: &[i32], lens: &[i32], total: usize) -> Result<Vec<usize>, String> {
    let mut at = 0usize;
    let mut blocks = Vec::with_capacity(starts.len());
    for (rank, (&start, &len)) in starts.iter().zip(lens).enumerate() {
        let (start, len) = (length("block start", start)?, length("block length", len)?);
        if start != at {
            return Err(format!("LightGBM's block {rank} starts at {start}, not at {at}"));
        }
        at = at.saturating_add(len);
        blocks.push(len);
    }
    if at != total {
        return Err(format!("LightGBM's blocks add up to {at} bytes, its buffer is {total}"));
    }
    Ok(blocks)
}

/// Reads LightGBM's two block arrays of `count` integers each.
///
/// # Safety
///
/// Each pointer is LightGBM's array of `count` integers, checked non-null here.
unsafe fn block_arrays(
    starts: *const i32,
    lens: *const i32,
    count: usize,
) -> Result<(Vec<i32>, Vec<i32>), String> {
    non_null("block start array", starts, count * 4)?;
    non_null("block length array", lens, count * 4)?;
    // SAFETY: non-null arrays of `count` integers (the caller's promise).
    let (starts, lens) =
        unsafe { (slice(starts.cast(), count * 4), slice(lens.cast(), count * 4)) };
    Ok((integers(starts), integers(lens)))
}

/// What a signal handler raised in a LightGBM hook since the last call, if anything: the
/// exception `silvic_net.lightgbm.network` raises in place of LightGBM's error.
#[pyfunction]
fn _lightgbm_take_signal(py: Python<'_>) -> Option<Py<PyAny>> {
    let signal = SIGNALLED.lock().unwrap_or_else(|e| e.into_inner()).take();
    signal.map(|signal| signal.into_value(py).into_any())
}

/// Runs `body` with the lent ring, or says there is none. A call whose arguments `body`
/// refuses fails on every rank as a call of `op` ([`silvic_net::TcpCollective::refuse`]). A
/// signal cancels the call as it does any collective's ([`crate::interrupt`]), and what its
/// handler raised is kept for `network` to raise.
fn with_ring<R>(
    op: Op,
    body: impl FnOnce(&mut silvic_net::TcpCollective) -> Result<R, Failure>,
) -> Result<R, String> {
    let mut slot = active();
    let lent = slot.as_mut().ok_or_else(|| {
        "no silvic-net ring is LightGBM's network here: call lgb.train inside \
         `with silvic_net.lightgbm.network(ring):`"
            .to_string()
    })?;
    let (outcome, signal) = crate::interrupt::interruptible(|| body(&mut lent.ring));
    if let Some(signal) = signal {
        *SIGNALLED.lock().unwrap_or_else(|e| e.into_inner()) = Some(signal);
    }
    outcome.map_err(|failure| {
        let error = match failure {
            Failure::Arguments(reason) => lent.ring.refuse(op, reason),
            Failure::Collective(error) => error,
        };
        format!("silvic-net: {error}")
    })
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
/// `ReduceFunction` does. Null pointers and a `num_block` other than the ring's world are
/// refused before anything is read.
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
        with_ring(Op::ReduceScatterRecords, |ring| {
            let (rank, world) = (ring.rank(), ring.world_size());
            let (input_size, output_size) =
                (length("input size", input_size)?, length("output size", output_size)?);
            let record = length("record size", type_size)?;
            let count = block_count(num_block, world)?;
            let reducer = reducer.ok_or_else(|| "LightGBM passed no reducer".to_string())?;
            non_null("input", input, input_size)?;
            non_null("output", output, output_size)?;
            // SAFETY: LightGBM's arrays of `num_block` integers, `num_block` the world's size.
            let (starts, lens) = unsafe { block_arrays(block_start, block_len, count)? };
            let blocks = layout(&starts, &lens, input_size)?;
            if blocks[rank] > output_size {
                return Err(Failure::Arguments(format!(
                    "LightGBM's output of {output_size} bytes cannot hold block {rank} of {} bytes",
                    blocks[rank]
                )));
            }
            // LightGBM's input is scratch (its own reduce-scatters fold into it), so the ring
            // folds in place, unless the output overlaps it.
            let (from, to) = (input as usize, output as usize);
            let disjoint =
                from.saturating_add(input_size) <= to || to.saturating_add(output_size) <= from;
            let mut copy = Vec::new();
            let work: &mut [u8] = if disjoint {
                // SAFETY: `input_size` bytes of LightGBM's input (non-null), apart from its output.
                unsafe { slice_mut(input.cast(), input_size) }
            } else {
                // SAFETY: `input_size` bytes of LightGBM's input, copied before `output` is
                // written.
                copy.extend_from_slice(unsafe { slice(input.cast(), input_size) });
                &mut copy
            };
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
            ring.reduce_scatter_records(work, &blocks, record, &fold)
                .map_err(Failure::Collective)?;
            let start: usize = blocks[..rank].iter().sum();
            // SAFETY: `output_size` bytes of LightGBM's output (non-null), no other reference
            // alive.
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
        with_ring(Op::AllgatherBlocks, |ring| {
            let (rank, world) = (ring.rank(), ring.world_size());
            let (input_size, output_size) =
                (length("input size", input_size)?, length("output size", output_size)?);
            let count = block_count(num_block, world)?;
            non_null("input", input, input_size)?;
            non_null("output", output, output_size)?;
            // SAFETY: LightGBM's arrays of `num_block` integers, `num_block` the world's size.
            let (starts, lens) = unsafe { block_arrays(block_start, block_len, count)? };
            let blocks = layout(&starts, &lens, output_size)?;
            if blocks[rank] != input_size {
                return Err(Failure::Arguments(format!(
                    "LightGBM passed {input_size} bytes for block {rank} of {} bytes",
                    blocks[rank]
                )));
            }
            // SAFETY: `input_size` bytes of LightGBM's input (non-null), copied before `output`
            // is written (LightGBM's allreduce passes a block that lies inside `output`).
            let local = unsafe { slice(input.cast(), input_size) }.to_vec();
            // SAFETY: `output_size` bytes of LightGBM's output (non-null); `local` is a copy.
            let out = unsafe { slice_mut(output.cast(), output_size) };
            let start: usize = blocks[..rank].iter().sum();
            out[start..start + input_size].copy_from_slice(&local);
            ring.allgather_blocks(out, &blocks).map_err(Failure::Collective)
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
