#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| shardproof_fuzz::infer(data));
