//! Shared harness for the integration suites.
