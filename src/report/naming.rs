//! Default names for run directories.

use std::time::{SystemTime, UNIX_EPOCH};

/// `{prefix}-YYYYMMDD-HHMMSS` for the UTC time `at`: a run directory name that sorts by
/// start time. Times before 1970 count as 1970-01-01 00:00:00.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use rlvr::report::run_name;
/// let at = UNIX_EPOCH + Duration::from_secs(1_764_451_845);
/// assert_eq!(run_name("gsm8k", at), "gsm8k-20251129-213045");
/// // A fresh run directory: runs/gsm8k-<now>.
/// let dir = std::path::Path::new("runs").join(run_name("gsm8k", std::time::SystemTime::now()));
/// ```
pub fn run_name(prefix: &str, at: SystemTime) -> String {
    let secs = at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{prefix}-{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of `days` days after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for non-negative day counts).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn known_dates() {
        assert_eq!(run_name("r", at(0)), "r-19700101-000000");
        // 2000-02-29 (a leap day of a century leap year) 23:59:59.
        assert_eq!(run_name("r", at(951_868_799)), "r-20000229-235959");
        assert_eq!(run_name("r", at(951_868_800)), "r-20000301-000000");
        // 2100 is not a leap year: 2100-02-28 is followed by 2100-03-01.
        assert_eq!(run_name("r", at(4_107_456_000)), "r-21000228-000000");
        assert_eq!(run_name("r", at(4_107_542_400)), "r-21000301-000000");
        assert_eq!(
            run_name("r", UNIX_EPOCH - Duration::from_secs(5)),
            "r-19700101-000000"
        );
    }

    #[test]
    fn each_day_is_the_next_calendar_date() {
        // Walking day by day, the date advances by exactly one calendar day.
        let mut prev = civil_from_days(0);
        for days in 1..150_000 {
            let cur = civil_from_days(days);
            let (py, pm, pd) = prev;
            let leap = (py % 4 == 0 && py % 100 != 0) || py % 400 == 0;
            let len = [
                31,
                if leap { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ];
            let expected = if pd < len[(pm - 1) as usize] {
                (py, pm, pd + 1)
            } else if pm < 12 {
                (py, pm + 1, 1)
            } else {
                (py + 1, 1, 1)
            };
            assert_eq!(cur, expected, "day {days}");
            prev = cur;
        }
    }
}
