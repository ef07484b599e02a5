//! The manifests as `kubectl kustomize` renders them, and what the tests
//! read from them: the Deployment's container, its volumes, the ConfigMaps'
//! files.

use serde::Deserialize;
use serde_yaml::Value;
use std::path::Path;
use std::process::Command;

/// Every kustomization a user may apply.
pub const OVERLAYS: [&str; 5] = [
    "base",
    "overlays/try",
    "overlays/production",
    "overlays/monitoring",
    "overlays/rls",
];

/// One kustomization, rendered.
pub struct Rendered {
    /// Which (a path under deploy/kubernetes).
    pub name: String,
    /// The rendered text, as `kubectl apply -k` would send it.
    pub text: String,
    /// Its objects.
    pub objects: Vec<Value>,
}

impl Rendered {
    /// Renders deploy/kubernetes/`name` with `kubectl kustomize`, or, where
    /// kubectl is missing or its kustomize too old, `kustomize build`
    /// (.ci/run installs one of them).
    pub fn of(name: &str) -> Self {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy/kubernetes")
            .join(name);
        let mut failures = Vec::new();
        for (program, verb) in [("kubectl", "kustomize"), ("kustomize", "build")] {
            match Command::new(program).arg(verb).arg(&dir).output() {
                Ok(output) if output.status.success() => {
                    let text = String::from_utf8(output.stdout).expect("UTF-8");
                    return Self::from_text(name, &text);
                }
                Ok(output) => failures.push(format!(
                    "{program} {verb}: {}",
                    String::from_utf8_lossy(&output.stderr)
                )),
                Err(e) => failures.push(format!("{program}: {e}")),
            }
        }
        panic!(
            "cannot render {name} (.ci/run installs a renderer):\n{}",
            failures.join("\n")
        );
    }

    /// Objects from a rendered `text` (`name` says which, in messages).
    pub fn from_text(name: &str, text: &str) -> Self {
        let objects = serde_yaml::Deserializer::from_str(text)
            .map(|doc| Value::deserialize(doc).expect("rendered YAML"))
            .filter(|v| !v.is_null())
            .collect();
        Rendered {
            name: name.to_string(),
            text: text.to_string(),
            objects,
        }
    }

    /// The object of `kind` named `name`, if there is one.
    pub fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objects
            .iter()
            .find(|o| str_at(o, "kind") == Some(kind) && str_at(o, "metadata.name") == Some(name))
    }

    /// The object of `kind` named `name`.
    pub fn get(&self, kind: &str, name: &str) -> &Value {
        self.find(kind, name)
            .unwrap_or_else(|| panic!("{}: no {kind} {name}", self.name))
    }

    /// The sluice Deployment.
    pub fn deployment(&self) -> &Value {
        self.get("Deployment", "sluice")
    }

    /// The sluice container of the Deployment.
    pub fn container(&self) -> &Value {
        let containers = at(self.deployment(), "spec.template.spec.containers");
        seq(containers)
            .iter()
            .find(|c| str_at(c, "name") == Some("sluice"))
            .expect("a container named sluice")
    }

    /// The files of ConfigMap `name` (`data`), as (key, content).
    pub fn config_map_files(&self, name: &str) -> Vec<(String, String)> {
        let data = at(self.get("ConfigMap", name), "data");
        data.as_mapping()
            .expect("ConfigMap data")
            .iter()
            .map(|(k, v)| {
                let key = k.as_str().expect("key").to_string();
                (key, v.as_str().expect("text").to_string())
            })
            .collect()
    }

    /// The content of the ConfigMap `sluice`'s `sluice.yaml`.
    pub fn sluice_yaml(&self) -> String {
        self.config_map_files("sluice")
            .into_iter()
            .find(|(k, _)| k == "sluice.yaml")
            .map(|(_, v)| v)
            .expect("sluice.yaml in the ConfigMap sluice")
    }

    /// The container port named `name`.
    pub fn container_port(&self, name: &str) -> u16 {
        seq(at(self.container(), "ports"))
            .iter()
            .find(|p| str_at(p, "name") == Some(name))
            .and_then(|p| at(p, "containerPort").as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or_else(|| panic!("{}: no container port {name}", self.name))
    }
}

/// The value at a dotted `path` (`Value::Null` when absent).
pub fn at<'a>(value: &'a Value, path: &str) -> &'a Value {
    static NULL: Value = Value::Null;
    path.split('.')
        .try_fold(value, |v, key| v.get(key))
        .unwrap_or(&NULL)
}

/// The string at a dotted `path`.
pub fn str_at<'a>(value: &'a Value, path: &str) -> Option<&'a str> {
    at(value, path).as_str()
}

/// The sequence `value` (empty when it is not one).
pub fn seq(value: &Value) -> &[Value] {
    value.as_sequence().map(Vec::as_slice).unwrap_or(&[])
}
