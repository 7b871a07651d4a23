//! Iteration-level scheduler and engine loop.
