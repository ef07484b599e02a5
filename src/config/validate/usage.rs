//! `reserve` and `cost_from`: what a limit takes before the request is
//! proxied, and where the response says what it cost.

use super::super::checker::Checker;
use super::super::file::{AlgorithmFile, LimitFile, OnLimitFile, PointersFile, ReserveFile};
use super::super::problem::{KeyPath, ProblemKind};
use super::super::usage::{CostFrom, JsonPointers, Reserve};

/// `cost_from`: exactly one of `response_header` and `response_json`.
pub(super) fn cost_from(c: &mut Checker, path: &KeyPath, f: &LimitFile) -> Option<CostFrom> {
    let from = f.cost_from.as_ref()?;
    let at = path.key("cost_from");
    match (&from.response_header, &from.response_json) {
        (Some(name), None) => {
            c.header_name(&at.key("response_header"), name);
            Some(CostFrom::Header(name.to_ascii_lowercase()))
        }
        (None, Some(pointers)) => {
            pointers_at(c, &at.key("response_json"), pointers).map(CostFrom::Json)
        }
        _ => {
            let kind = ProblemKind::OneOf {
                owner: "`cost_from`",
                keys: "`response_header` or `response_json`",
            };
            c.problem(&at, kind);
            None
        }
    }
}

/// The pointers of `file`, each checked.
fn pointers_at(c: &mut Checker, at: &KeyPath, file: &PointersFile) -> Option<JsonPointers> {
    match JsonPointers::new(file.0.clone()) {
        Ok(pointers) => Some(pointers),
        Err(bad) => {
            let bad_at = match file.0.iter().position(|p| *p == bad) {
                Some(i) if file.0.len() > 1 => at.index(i),
                _ => at.clone(),
            };
            c.problem(&bad_at, ProblemKind::BadJsonPointer(bad));
            None
        }
    }
}

/// `reserve`: a constant, or read from the request body, on a limit whose
/// units are taken at admission.
pub(super) fn reserve(
    c: &mut Checker,
    path: &KeyPath,
    f: &LimitFile,
    kind: AlgorithmFile,
) -> Option<Reserve> {
    let file = f.reserve.as_ref()?;
    let at = path.key("reserve");
    let why = if kind == AlgorithmFile::Concurrency {
        Some("a `concurrency` limit (it counts requests in flight)")
    } else if f.count_when.is_some() {
        Some("a limit counted by status (`count_when`)")
    } else if f.on_limit == Some(OnLimitFile::Delay) {
        Some("a limit that delays (`on_limit: delay`)")
    } else {
        None
    };
    if let Some(why) = why {
        let key = "reserve";
        c.problem(&at, ProblemKind::NotDeferrable { key, why });
    }
    if f.cost.is_some() {
        let kind = ProblemKind::NotBoth {
            owner: "a limit takes",
            a: "cost",
            b: "reserve",
        };
        c.problem(&path.key("cost"), kind);
    }
    let read = match file {
        ReserveFile::Units(0) => {
            let kind = ProblemKind::AtLeast {
                key: "reserve",
                min: "1",
            };
            c.problem(&at, kind);
            return None;
        }
        ReserveFile::Units(units) => {
            return Some(Reserve {
                request_json: None,
                default: 0,
                max: u64::MAX,
                plus: *units,
                required: false,
            })
        }
        ReserveFile::Read(read) => read,
    };
    let Some(pointers) = &read.request_json else {
        c.problem(&at, ProblemKind::Needs("reserve", "request_json"));
        return None;
    };
    let request_json = pointers_at(c, &at.key("request_json"), pointers)?;
    let max = read.max.unwrap_or(u64::MAX);
    if max == 0 {
        let kind = ProblemKind::AtLeast {
            key: "max",
            min: "1",
        };
        c.problem(&at.key("max"), kind);
    }
    let default = match (read.default, read.max) {
        (Some(default), _) => default,
        (None, Some(max)) => max,
        (None, None) if read.required => 0,
        (None, None) => {
            c.problem(&at, ProblemKind::ReserveNeedsDefault);
            0
        }
    };
    Some(Reserve {
        request_json: Some(request_json),
        default,
        max,
        plus: read.plus.unwrap_or(0),
        required: read.required,
    })
}
