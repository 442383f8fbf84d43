//! AFL++ entry point of the `json` target ([`sluice_fuzz::json`]); run it with `scripts/fuzz.sh json`.
fn main() {
    afl::fuzz!(|data: &[u8]| sluice_fuzz::json(data));
}
