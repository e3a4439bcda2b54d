//! Fuzz target: see `silvic_net_fuzz::exchange_rank0` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| silvic_net_fuzz::exchange_rank0(data));
