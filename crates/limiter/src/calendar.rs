//! Calendar quotas (`calendar: day | week | month` with `timezone`): which
//! civil period an instant falls in, as Unix-microsecond bounds.
//!
//! Redis has no time zones, so the gateway names the periods: each decision
//! carries the bounds of the period the gateway's clock is in, and of its
//! neighbours, and Redis's own clock picks among them. Instances whose clocks
//! disagree near midnight still count each request in one period, the one
//! Redis's clock says.

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::Timestamp;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The civil period a calendar quota counts over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// From midnight to midnight.
    Day,
    /// From Monday 00:00 to the next Monday 00:00 (ISO weeks).
    Week,
    /// From the 1st 00:00 to the next month's 1st 00:00.
    Month,
}

impl Period {
    /// The name used in the file.
    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }

    /// The longest such period can be (a DST change adds an hour): the bound
    /// on any reset or retry time a calendar quota reports.
    pub fn longest(self) -> Duration {
        let days = match self {
            Period::Day => 1,
            Period::Week => 7,
            Period::Month => 31,
        };
        Duration::from_secs(days * 86_400 + 3_600)
    }

    /// The period's usual length, which the `RateLimit-Policy` header reports.
    pub fn nominal(self) -> Duration {
        let days = match self {
            Period::Day => 1,
            Period::Week => 7,
            Period::Month => 30,
        };
        Duration::from_secs(days * 86_400)
    }

    /// The first day of the period that holds `day`.
    fn first_day(self, day: Date) -> Result<Date, jiff::Error> {
        match self {
            Period::Day => Ok(day),
            Period::Week => {
                let back = i64::from(day.weekday().to_monday_zero_offset());
                day.checked_sub(jiff::Span::new().days(back))
            }
            Period::Month => Ok(day.first_of_month()),
        }
    }

    /// The first day of the period after the one starting on `first`.
    fn next_first_day(self, first: Date) -> Result<Date, jiff::Error> {
        let step = match self {
            Period::Day => jiff::Span::new().days(1),
            Period::Week => jiff::Span::new().weeks(1),
            Period::Month => jiff::Span::new().months(1),
        };
        first.checked_add(step)
    }
}

/// The period an instant falls in, with its neighbour: `[start, end)` and
/// the next period `[end, next_end)`, in microseconds since the Unix epoch.
/// The previous period ends at `start`. All zero outside a calendar quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeriodBounds {
    /// The period's first microsecond.
    pub start_us: i64,
    /// The next period's first microsecond.
    pub end_us: i64,
    /// The first microsecond of the period after the next.
    pub next_end_us: i64,
}

impl PeriodBounds {
    /// Whether `now_us` lies in `[start, end)`.
    pub fn holds(&self, now_us: i64) -> bool {
        (self.start_us..self.end_us).contains(&now_us)
    }
}

/// A calendar quota's periods in one time zone. Cheap to ask: the bounds are
/// computed once per period and remembered.
#[derive(Debug, Clone)]
pub struct Calendar {
    /// Day, week or month.
    pub period: Period,
    /// The IANA name (`Europe/Paris`), or `UTC`.
    pub zone_name: String,
    zone: TimeZone,
    remembered: Arc<Mutex<PeriodBounds>>,
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.period == other.period && self.zone_name == other.zone_name
    }
}

impl Calendar {
    /// The calendar of `period` in the IANA zone `zone_name` (the system's
    /// time zone database, or the one built into sluice when the system has
    /// none); an error names a zone that does not exist.
    pub fn new(period: Period, zone_name: &str) -> Result<Self, String> {
        let zone = TimeZone::get(zone_name).map_err(|e| e.to_string())?;
        Ok(Self {
            period,
            zone_name: zone_name.to_string(),
            zone,
            remembered: Arc::default(),
        })
    }

    /// The bounds of the period holding `now_us` (µs since the Unix epoch).
    /// Outside the years the time zone database covers (never for a real
    /// clock) the period falls back to whole UTC days.
    pub fn bounds_at(&self, now_us: i64) -> PeriodBounds {
        if let Ok(remembered) = self.remembered.lock() {
            if remembered.holds(now_us) {
                return *remembered;
            }
        }
        let bounds = self.compute(now_us).unwrap_or_else(|e| {
            log::warn!("calendar {}: {e}; counting whole UTC days", self.zone_name);
            let day = 86_400_000_000;
            let start = now_us - now_us.rem_euclid(day);
            PeriodBounds {
                start_us: start,
                end_us: start + day,
                next_end_us: start + 2 * day,
            }
        });
        if let Ok(mut remembered) = self.remembered.lock() {
            *remembered = bounds;
        }
        bounds
    }

    fn compute(&self, now_us: i64) -> Result<PeriodBounds, jiff::Error> {
        let now = Timestamp::from_microsecond(now_us)?;
        let today = now.to_zoned_datetime(self.zone.clone()).date();
        let first = self.period.first_day(today)?;
        let next = self.period.next_first_day(first)?;
        let after = self.period.next_first_day(next)?;
        Ok(PeriodBounds {
            start_us: self.midnight_us(first)?,
            end_us: self.midnight_us(next)?,
            next_end_us: self.midnight_us(after)?,
        })
    }

    /// The first instant of `day` in the zone (a day whose midnight a DST
    /// change skips starts at the first instant that exists).
    fn midnight_us(&self, day: Date) -> Result<i64, jiff::Error> {
        let start = day
            .to_datetime(jiff::civil::Time::midnight())
            .to_zoned_datetime(self.zone.clone())?;
        Ok(start.timestamp().as_microsecond())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(text: &str) -> i64 {
        let t: Timestamp = text.parse().expect("timestamp");
        t.as_microsecond()
    }

    #[test]
    fn a_utc_day_runs_midnight_to_midnight() {
        let c = Calendar::new(Period::Day, "UTC").expect("zone");
        let b = c.bounds_at(us("2026-12-03T22:30:00Z"));
        assert_eq!(b.start_us, us("2026-12-03T00:00:00Z"));
        assert_eq!(b.end_us, us("2026-12-04T00:00:00Z"));
        assert_eq!(b.next_end_us, us("2026-12-05T00:00:00Z"));
    }

    #[test]
    fn a_zone_moves_the_day_and_dst_shortens_it() {
        let c = Calendar::new(Period::Day, "Europe/Paris").expect("zone");
        // 23:30 UTC on 3 December is already the 4th in Paris (UTC+1).
        let b = c.bounds_at(us("2026-12-03T23:30:00Z"));
        assert_eq!(b.start_us, us("2026-12-03T23:00:00Z"));
        // 29 March 2026 has 23 hours in Paris; 25 October has 25.
        let spring = c.bounds_at(us("2026-03-29T12:00:00Z"));
        assert_eq!(spring.end_us - spring.start_us, 23 * 3_600_000_000);
        let autumn = c.bounds_at(us("2026-10-25T12:00:00Z"));
        assert_eq!(autumn.end_us - autumn.start_us, 25 * 3_600_000_000);
    }

    #[test]
    fn weeks_start_on_monday_and_months_on_the_first() {
        let week = Calendar::new(Period::Week, "UTC").expect("zone");
        // Thursday 3 December 2026 → Monday 30 November.
        let b = week.bounds_at(us("2026-12-03T10:00:00Z"));
        assert_eq!(b.start_us, us("2026-11-30T00:00:00Z"));
        assert_eq!(b.end_us, us("2026-12-07T00:00:00Z"));
        let month = Calendar::new(Period::Month, "America/New_York").expect("zone");
        let b = month.bounds_at(us("2028-02-15T12:00:00Z"));
        assert_eq!(b.start_us, us("2028-02-01T05:00:00Z"));
        assert_eq!(b.end_us, us("2028-03-01T05:00:00Z"), "a leap February");
        // March 2028 starts in EST and ends in EDT.
        assert_eq!(b.next_end_us, us("2028-04-01T04:00:00Z"));
    }

    #[test]
    fn remembered_bounds_follow_the_clock_into_the_next_period() {
        let c = Calendar::new(Period::Day, "UTC").expect("zone");
        let first = c.bounds_at(us("2026-12-03T23:59:59Z"));
        let second = c.bounds_at(us("2026-12-04T00:00:00Z"));
        assert_eq!(second.start_us, first.end_us);
        let back = c.bounds_at(us("2026-12-03T12:00:00Z"));
        assert_eq!(back, first, "a clock that steps back gets its own period");
    }

    #[test]
    fn an_unknown_zone_is_refused() {
        assert!(Calendar::new(Period::Day, "Mars/Olympus_Mons").is_err());
    }
}
