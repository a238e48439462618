//! The wall clock, read one way.
//!
//! Wall time is what records and answers carry (`Last-Modified`, a
//! leader's stamp on a log entry); elapsed time is measured with
//! [`std::time::Instant`] instead, which never jumps.

use std::time::{SystemTime, UNIX_EPOCH};

/// This machine's wall clock in milliseconds since the Unix epoch; 0 for a
/// clock set before 1970, `i64::MAX` past the year 292 million.
pub fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::wall_clock_ms;
    use std::time::{SystemTime, UNIX_EPOCH};

    #[test]
    fn reads_milliseconds_since_the_epoch() {
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970");
        let ms = wall_clock_ms();
        let after = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970");
        assert!(ms >= before.as_millis() as i64 && ms <= after.as_millis() as i64);
    }
}
