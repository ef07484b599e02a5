//! Which instance this process is: the pod and namespace Kubernetes gives
//! it through the downward API, in the OpenTelemetry way
//! (`OTEL_RESOURCE_ATTRIBUTES="k8s.pod.name=…,k8s.namespace.name=…"`),
//! else the host name. The access log, the traces' resource and
//! `/v1/status` say it, so a line, a span or a console page names the
//! instance it came from.

use std::sync::OnceLock;

/// This process's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The pod's name (`k8s.pod.name`), else the host name.
    pub name: String,
    /// The pod's namespace (`k8s.namespace.name`), when one is given.
    pub namespace: Option<String>,
    /// Whether `name` is a pod's (set by `k8s.pod.name`).
    pub is_pod: bool,
}

impl Instance {
    /// The identity `lookup` (the environment) gives, with `host` as the
    /// fallback name.
    pub fn from_env(
        lookup: impl Fn(&str) -> Option<String>,
        host: impl FnOnce() -> String,
    ) -> Self {
        let attributes = lookup("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
        let attribute = |wanted: &str| {
            attributes.split(',').find_map(|pair| {
                let (key, value) = pair.split_once('=')?;
                let value = percent_decoded(value.trim());
                (key.trim() == wanted && !value.is_empty()).then_some(value)
            })
        };
        let pod = attribute("k8s.pod.name");
        Instance {
            is_pod: pod.is_some(),
            name: pod.unwrap_or_else(host),
            namespace: attribute("k8s.namespace.name"),
        }
    }

    /// This process's identity, read once from its environment.
    pub fn current() -> &'static Instance {
        static CURRENT: OnceLock<Instance> = OnceLock::new();
        CURRENT.get_or_init(|| Instance::from_env(|name| std::env::var(name).ok(), host_name))
    }
}

/// The host's name (`HOSTNAME`, else the kernel's), or `unknown`.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

/// `text` with its `%XX` escapes decoded (the attributes' encoding); an
/// escape that is not one is kept as written.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(attributes: Option<&str>) -> Instance {
        let attributes = attributes.map(str::to_string);
        Instance::from_env(
            |name| {
                (name == "OTEL_RESOURCE_ATTRIBUTES")
                    .then(|| attributes.clone())
                    .flatten()
            },
            || "host-1".to_string(),
        )
    }

    #[test]
    fn the_pod_and_namespace_come_from_the_resource_attributes() {
        let pod = with(Some(
            "service.version=1, k8s.pod.name=sluice-7d9f-x2k4q,k8s.namespace.name=edge%2Dprod",
        ));
        assert_eq!(pod.name, "sluice-7d9f-x2k4q");
        assert_eq!(pod.namespace.as_deref(), Some("edge-prod"));
        assert!(pod.is_pod);
        let host = with(None);
        assert_eq!(
            (host.name.as_str(), host.namespace, host.is_pod),
            ("host-1", None, false)
        );
        // Hostile spellings: no value, no `=`, a broken escape.
        let odd = with(Some(
            "k8s.pod.name=,k8s.namespace.name,=x,k8s.pod.name=a%zz%4",
        ));
        assert_eq!((odd.name.as_str(), odd.namespace), ("a%zz%4", None));
    }
}
