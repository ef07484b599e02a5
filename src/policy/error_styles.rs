//! Sluice's own answers in the error shape of the API a route fronts
//! (`errors: openai | anthropic`), so that the API's SDKs read them as
//! their own: OpenAI's `{"error": {"message", "type", "param", "code"}}`
//! (a 429 typed `requests` or `tokens` with code `rate_limit_exceeded`),
//! Anthropic's `{"type": "error", "error": {"type", "message"}}` (a 429 is
//! a `rate_limit_error`). Status and headers stay sluice's.

use super::rejection::Rejection;
use crate::config::ErrorStyle;
use serde_json::json;

/// The body of `rejection`, answered with `status` and sluice's error code
/// `code`, in `style` (`None` for sluice's own shape).
pub(super) fn body(
    style: ErrorStyle,
    rejection: &Rejection<'_>,
    status: u16,
    code: &'static str,
) -> Option<Vec<u8>> {
    let message = message(rejection);
    let body = match style {
        ErrorStyle::Sluice => return None,
        ErrorStyle::Openai => {
            let (kind, code) = match rejection {
                Rejection::TooMany { counts_tokens, .. } => {
                    let kind = if *counts_tokens { "tokens" } else { "requests" };
                    (kind, "rate_limit_exceeded")
                }
                _ if status >= 500 => ("server_error", code),
                _ => ("invalid_request_error", code),
            };
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
        ErrorStyle::Anthropic => {
            let kind = match status {
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                s if s >= 500 => "api_error",
                _ => "invalid_request_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
    };
    serde_json::to_vec(&body).ok()
}

/// What went wrong, in a sentence for a person.
fn message(rejection: &Rejection<'_>) -> String {
    match rejection {
        Rejection::BadRequest => "The request target or Host is not valid.".into(),
        Rejection::NotFound => "No route matches this request.".into(),
        Rejection::Unauthorized { .. } => "Missing or invalid credentials.".into(),
        Rejection::TooMany {
            route,
            limit,
            retry_after,
            ..
        } => format!(
            "Rate limit reached for {limit} on {route}. Please try again in {retry_after}s."
        ),
        Rejection::Unavailable { route } => {
            format!("The rate limiter of {route} is unavailable. Please try again.")
        }
        Rejection::BadGateway { .. } => "The upstream could not be reached.".into(),
        Rejection::GatewayTimeout { .. } => "The upstream did not answer in time.".into(),
        Rejection::PayloadTooLarge { .. } => "The request body is too large.".into(),
        Rejection::UnreadableBody { limit, reason, .. } => {
            format!("{} (limit {limit} reads it).", capitalized(reason.as_str()))
        }
        Rejection::LengthRequired { .. } => {
            "A request body this large must declare its Content-Length.".into()
        }
        Rejection::AuthRefused { .. } | Rejection::Internal => "Internal error.".into(),
    }
}

/// `text` with its first letter upper case.
fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::usage::NoReservation;
    use serde_json::Value;

    fn too_many(counts_tokens: bool) -> Rejection<'static> {
        Rejection::TooMany {
            status: 429,
            route: "chat",
            limit: "tpm",
            counts_tokens,
            retry_after: 7,
            headers: Vec::new(),
        }
    }

    fn body_of(style: ErrorStyle, rejection: &Rejection<'_>) -> (u16, Value) {
        let reply = rejection.reply_in(style);
        let body = serde_json::from_slice(&reply.body).expect("JSON");
        (reply.status, body)
    }

    #[test]
    fn openai_errors_have_openais_shape() {
        let (status, body) = body_of(ErrorStyle::Openai, &too_many(true));
        assert_eq!(status, 429);
        let error = &body["error"];
        assert_eq!(error["code"], "rate_limit_exceeded");
        assert_eq!(error["type"], "tokens");
        assert_eq!(error["param"], Value::Null);
        assert!(error["message"]
            .as_str()
            .unwrap()
            .contains("try again in 7s"));
        let (_, body) = body_of(ErrorStyle::Openai, &too_many(false));
        assert_eq!(body["error"]["type"], "requests");
        let unreadable = Rejection::UnreadableBody {
            route: "chat",
            limit: "tpm",
            reason: NoReservation::NotJson,
        };
        let (status, body) = body_of(ErrorStyle::Openai, &unreadable);
        assert_eq!(status, 400);
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], "bad_body");
        assert_eq!(
            body["error"]["message"],
            "The request body is not JSON (limit tpm reads it)."
        );
        let large = Rejection::PayloadTooLarge {
            route: Some("chat"),
        };
        let (status, body) = body_of(ErrorStyle::Openai, &large);
        assert_eq!(status, 413);
        let keys: Vec<&String> = body["error"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["code", "message", "param", "type"]);
        let (_, body) = body_of(ErrorStyle::Openai, &Rejection::BadGateway { route: None });
        assert_eq!(body["error"]["type"], "server_error");
    }

    #[test]
    fn anthropic_errors_have_anthropics_shape() {
        for (rejection, status, kind) in [
            (too_many(true), 429, "rate_limit_error"),
            (
                Rejection::UnreadableBody {
                    route: "chat",
                    limit: "tpm",
                    reason: NoReservation::NoNumber,
                },
                400,
                "invalid_request_error",
            ),
            (
                Rejection::PayloadTooLarge { route: None },
                413,
                "request_too_large",
            ),
            (
                Rejection::Unauthorized { challenge: None },
                401,
                "authentication_error",
            ),
            (Rejection::Unavailable { route: "chat" }, 503, "api_error"),
        ] {
            let (got, body) = body_of(ErrorStyle::Anthropic, &rejection);
            assert_eq!(got, status);
            assert_eq!(body["type"], "error");
            assert_eq!(body["error"]["type"], kind, "{rejection:?}");
            assert!(body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()));
        }
    }

    #[test]
    fn sluice_errors_keep_their_own_shape() {
        let (_, body) = body_of(ErrorStyle::Sluice, &too_many(true));
        assert_eq!(body["error"], "too_many_requests");
        assert_eq!(body["limit"], "tpm");
    }
}
