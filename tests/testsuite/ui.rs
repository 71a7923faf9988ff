//! Compile-time behaviour of the attribute macros: what compiles, and the error every misuse
//! gets, spanned on the offending token. Regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p caracal-tests --test testsuite ui::`, then read every changed
//! `.stderr`.
//!
//! The case paths are relative to the package directory, where cargo runs the test binary.

#[test]
fn attribute_misuse_fails_to_compile_and_correct_use_compiles() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("ui/fail/*.rs");
    cases.pass("ui/pass/*.rs");
}
