//! Compile-time behaviour of the attribute macros: what compiles, and the error every misuse
//! gets, spanned on the offending token. Regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p caracal-tests --test ui`, then read every changed
//! `.stderr`.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("ui/fail/*.rs");
    cases.pass("ui/pass/*.rs");
}
