//! Typed response streams for LLM serving: prologue, errors, cancellation, plane selection
