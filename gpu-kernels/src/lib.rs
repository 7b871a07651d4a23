//! GPU kernels (to be written).
#![no_std]
