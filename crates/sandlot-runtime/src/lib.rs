//! The sandbox runtime.
