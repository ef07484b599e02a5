//! `tracing:`: the OTLP endpoint, the sampling ratio and the service name.

use super::super::checker::Checker;
use super::super::file::TracingFile;
use super::super::problem::{KeyPath, ProblemKind};
use super::super::TracingConfig;

/// The validated `tracing:` section; `None` when absent or without an
/// endpoint (tracing off).
pub(super) fn tracing(c: &mut Checker, f: Option<&TracingFile>) -> Option<TracingConfig> {
    let f = f?;
    let at = KeyPath::root("tracing");
    let ratio = f.sample_ratio.unwrap_or(0.01);
    if !(0.0..=1.0).contains(&ratio) {
        c.problem(&at.key("sample_ratio"), ProblemKind::BadSampleRatio);
    }
    let service_name = f.service_name.clone().unwrap_or_else(|| "sluice".into());
    if service_name.trim().is_empty() {
        c.problem(
            &at.key("service_name"),
            ProblemKind::Empty("service_name".into()),
        );
    }
    let endpoint = f.otlp_endpoint.as_deref()?;
    let Some(otlp_endpoint) = traces_url(endpoint) else {
        let kind = ProblemKind::BadOtlpEndpoint(endpoint.into());
        c.problem(&at.key("otlp_endpoint"), kind);
        return None;
    };
    Some(TracingConfig {
        otlp_endpoint,
        sample_ratio: ratio,
        service_name,
        always_sample_denied: f.always_sample_denied.unwrap_or(true),
    })
}

/// `endpoint` as the URL spans are posted to: `/v1/traces` appended when it
/// has no path (as `OTEL_EXPORTER_OTLP_ENDPOINT` is read); `None` when it is
/// not an http(s) URL with a host.
fn traces_url(endpoint: &str) -> Option<String> {
    let uri: http::Uri = endpoint.parse().ok()?;
    let scheme = uri.scheme_str()?;
    if !matches!(scheme, "http" | "https") || uri.host().is_none_or(str::is_empty) {
        return None;
    }
    match uri.path() {
        "" | "/" => Some(format!("{}/v1/traces", endpoint.trim_end_matches('/'))),
        _ => Some(endpoint.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn endpoints_without_a_path_get_the_traces_path() {
        let url = |e: &str| traces_url(e);
        assert_eq!(
            url("http://127.0.0.1:4318").as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            url("https://otel:4318/").as_deref(),
            Some("https://otel:4318/v1/traces")
        );
        assert_eq!(
            url("http://c/custom/path").as_deref(),
            Some("http://c/custom/path")
        );
        for bad in ["127.0.0.1:4318", "ftp://x", "http://", "grpc://c:4317", ""] {
            assert_eq!(url(bad), None, "{bad}");
        }
    }
}
