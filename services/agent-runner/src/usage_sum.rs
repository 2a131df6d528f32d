//! Token counts added up: a turn's or a request's usage onto a running total. A leaf,
//! so the gateway's grants and the drivers' meters can share it without reaching into
//! each other.

use forkyard_proto::common::v1::Usage;

/// `b`'s tokens added to `a`'s.
pub(crate) fn add(a: &mut Usage, b: &Usage) {
    a.input_tokens += b.input_tokens;
    a.output_tokens += b.output_tokens;
    a.cache_read_tokens += b.cache_read_tokens;
    a.cache_write_tokens += b.cache_write_tokens;
}
