//! AFL++ entry point of the `rules` target ([`sluice_fuzz::rules`]); run it with `scripts/fuzz.sh rules`.
fn main() {
    afl::fuzz!(|data: &[u8]| sluice_fuzz::rules(data));
}
