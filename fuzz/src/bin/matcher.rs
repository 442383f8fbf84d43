//! AFL++ entry point of the `matcher` target ([`sluice_fuzz::matcher`]); run it with `scripts/fuzz.sh matcher`.
fn main() {
    afl::fuzz!(|data: &[u8]| sluice_fuzz::matcher(data));
}
