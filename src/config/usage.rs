//! A limit's usage keys as validated: what a request reserves before it is
//! proxied (`reserve`), and where its response says what it cost
//! (`cost_from`), with the JSON pointers (RFC 6901) both read.

use serde_json::Value;

/// JSON pointers, each `""` (the whole document) or `/`-separated tokens
/// with `~` written only as `~0` or `~1`: a valid list, never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPointers(Vec<String>);

impl JsonPointers {
    /// The pointers; `Err` with the first that is not a JSON pointer (or
    /// with `""` for an empty list).
    pub fn new(pointers: Vec<String>) -> Result<Self, String> {
        if pointers.is_empty() {
            return Err(String::new());
        }
        match pointers.iter().find(|p| !is_json_pointer(p)) {
            Some(bad) => Err(bad.clone()),
            None => Ok(JsonPointers(pointers)),
        }
    }

    /// The pointers, in the order written.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// The units at the first pointer `document` holds a count at (see
    /// [`units`]); `None` when none does.
    pub fn first_units(&self, document: &Value) -> Option<u64> {
        self.0
            .iter()
            .find_map(|p| document.pointer(p).and_then(units))
    }
}

/// Whether `text` is a JSON pointer (RFC 6901).
fn is_json_pointer(text: &str) -> bool {
    if text.is_empty() {
        return true;
    }
    if !text.starts_with('/') {
        return false;
    }
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b == b'~' && !matches!(bytes.next(), Some(b'0' | b'1')) {
            return false;
        }
    }
    true
}

/// A count of units: a non-negative whole number (`12`, `12.0`); anything
/// else (`null`, a string, a fraction, a negative number) is no value.
pub fn units(value: &Value) -> Option<u64> {
    if let Some(n) = value.as_u64() {
        return Some(n);
    }
    let f = value.as_f64()?;
    (f >= 0.0 && f.fract() == 0.0 && f < u64::MAX as f64).then_some(f as u64)
}

/// Where a response says what it cost (`cost_from`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostFrom {
    /// A response header's whole number (lower-case name).
    Header(String),
    /// The numbers at these pointers in the JSON body, or in the last event
    /// of a `text/event-stream` that carries each, summed.
    Json(JsonPointers),
}

impl CostFrom {
    /// The phrase `describe` uses.
    pub fn describe(&self) -> String {
        match self {
            CostFrom::Header(name) => format!("cost from {name}"),
            CostFrom::Json(pointers) => format!("cost from {}", pointers.as_slice().join(" + ")),
        }
    }
}

/// What a request reserves before it is proxied (`reserve`): the number
/// the request's JSON body holds at the first of `request_json` present (or
/// `default`), at most `max`, plus `plus`; a constant `plus` alone when
/// nothing is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserve {
    /// Where the request says how much it may use; `None`: a constant.
    pub request_json: Option<JsonPointers>,
    /// The number for a request that says none (and is not refused).
    pub default: u64,
    /// The most a request's number counts for.
    pub max: u64,
    /// Units added to the number (a constant part, such as the prompt).
    pub plus: u64,
    /// A request that says no number is refused (400) instead.
    pub required: bool,
}

/// Why a request could not say what it reserves (`required: true`): the
/// reason its 400 gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoReservation {
    /// The body is not one JSON document.
    #[error("{}", self.as_str())]
    NotJson,
    /// No pointer leads to a whole number.
    #[error("{}", self.as_str())]
    NoNumber,
}

impl NoReservation {
    /// The reason, as a 400's body gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            NoReservation::NotJson => "the request body is not JSON",
            NoReservation::NoNumber => "the request body does not say how many units it may use",
        }
    }
}

impl Reserve {
    /// The units a request whose body is `body` (parsed once, as the
    /// limits of a route share it) reserves.
    pub fn units(&self, body: &Result<Value, NoReservation>) -> Result<u64, NoReservation> {
        let Some(pointers) = &self.request_json else {
            return Ok(self.plus);
        };
        let read = match body {
            Ok(document) => pointers
                .first_units(document)
                .ok_or(NoReservation::NoNumber),
            Err(e) => Err(*e),
        };
        let number = match read {
            Ok(n) => n,
            Err(e) if self.required => return Err(e),
            Err(_) => self.default,
        };
        Ok(number.min(self.max).saturating_add(self.plus))
    }

    /// Whether it reads the request body.
    pub fn reads_body(&self) -> bool {
        self.request_json.is_some()
    }

    /// The phrase `describe` uses.
    pub fn describe(&self) -> String {
        match &self.request_json {
            None => format!("reserves {}", self.plus),
            Some(p) => {
                let plus = if self.plus > 0 {
                    format!(" + {}", self.plus)
                } else {
                    String::new()
                };
                format!(
                    "reserves {}{plus} (default {}, max {})",
                    p.as_slice().join(" or "),
                    self.default,
                    self.max
                )
            }
        }
    }
}

/// A request body as [`Reserve::units`] reads it: one JSON document.
pub fn parse_body(body: &[u8]) -> Result<Value, NoReservation> {
    serde_json::from_slice(body).map_err(|_| NoReservation::NotJson)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointers(list: &[&str]) -> JsonPointers {
        JsonPointers::new(list.iter().map(|s| s.to_string()).collect()).unwrap()
    }

    #[test]
    fn json_pointers_are_checked() {
        for good in ["", "/", "/usage/total_tokens", "/a~0b/c~1d", "/0"] {
            assert!(JsonPointers::new(vec![good.into()]).is_ok(), "{good}");
        }
        for bad in ["usage", "/a~", "/a~2", "~1"] {
            assert_eq!(JsonPointers::new(vec![bad.into()]), Err(bad.to_string()));
        }
        assert!(JsonPointers::new(Vec::new()).is_err());
    }

    #[test]
    fn a_reservation_is_read_from_the_first_pointer_present() {
        let reserve = Reserve {
            request_json: Some(pointers(&["/max_completion_tokens", "/max_tokens"])),
            default: 1024,
            max: 4096,
            plus: 10,
            required: false,
        };
        let units = |body: &str| reserve.units(&parse_body(body.as_bytes()));
        assert_eq!(units(r#"{"max_tokens": 100}"#), Ok(110));
        assert_eq!(
            units(r#"{"max_completion_tokens": 7, "max_tokens": 100}"#),
            Ok(17)
        );
        // null carries no value; a string is no number.
        assert_eq!(
            units(r#"{"max_completion_tokens": null, "max_tokens": 5}"#),
            Ok(15)
        );
        assert_eq!(units(r#"{"max_tokens": "100"}"#), Ok(1034));
        assert_eq!(units(r#"{"max_tokens": -1}"#), Ok(1034));
        assert_eq!(units(r#"{"max_tokens": 1.5}"#), Ok(1034));
        assert_eq!(units(r#"{"max_tokens": 100000000}"#), Ok(4106));
        assert_eq!(units("not json"), Ok(1034));
        assert_eq!(units(""), Ok(1034));
        let required = Reserve {
            required: true,
            ..reserve.clone()
        };
        let units = |body: &str| required.units(&parse_body(body.as_bytes()));
        assert_eq!(units("{}"), Err(NoReservation::NoNumber));
        assert_eq!(units("{"), Err(NoReservation::NotJson));
        assert_eq!(units(r#"{"max_tokens": 3}"#), Ok(13));
    }

    #[test]
    fn a_constant_reservation_reads_nothing() {
        let reserve = Reserve {
            request_json: None,
            default: 0,
            max: u64::MAX,
            plus: 500,
            required: false,
        };
        assert!(!reserve.reads_body());
        assert_eq!(reserve.units(&Err(NoReservation::NotJson)), Ok(500));
    }
}
