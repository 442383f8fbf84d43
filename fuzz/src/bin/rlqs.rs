//! AFL++ entry point of the `rlqs` target ([`sluice_fuzz::rlqs`]); run it with `scripts/fuzz.sh rlqs`.
fn main() {
    afl::fuzz!(|data: &[u8]| sluice_fuzz::rlqs(data));
}
