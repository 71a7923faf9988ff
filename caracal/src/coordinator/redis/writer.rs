//! Where a kernel's encoding writes: each argument straight into a Redis command.

use redis::{RedisWrite, ToRedisArgs};

use crate::kernel::Sink;

/// A [`Sink`] writing each argument into a Redis command.
pub(super) struct Writer<'a, W: ?Sized>(pub(super) &'a mut W);

impl<W: ?Sized + RedisWrite> Sink for Writer<'_, W> {
    fn int(&mut self, n: u64) {
        n.write_redis_args(self.0);
    }

    fn text(&mut self, text: &str) {
        text.write_redis_args(self.0);
    }
}
