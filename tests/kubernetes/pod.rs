//! A pod on this machine, as the Deployment describes it: its volumes
//! laid out the way the kubelet lays them out (a ConfigMap's files behind a
//! `..data` symlink that an update swaps), mounted at their paths in a mount
//! namespace whose every other mount is read-only (`readOnlyRootFilesystem`),
//! each `emptyDir` a fresh tmpfs, and the program run as the pod's user
//! with no capabilities and no way to gain any (`setpriv`), with only the
//! Deployment's environment.

use crate::manifests::{at, seq, str_at, Rendered};
use serde_yaml::Value;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where the image installs the program (docker/Dockerfile), and where the
/// pod runs it from.
const IN_POD: &str = "/usr/local/bin/sluice";

/// Exit status of the pod's script when the filesystem is not as the
/// manifests promise (a path it must not write to is writable).
pub const NOT_READ_ONLY: i32 = 97;

/// One pod's filesystem, identity and environment.
pub struct Pod {
    staging: tempfile::TempDir,
    /// (directory on this machine, path in the pod).
    mounts: Vec<(PathBuf, String)>,
    empty_dirs: Vec<String>,
    /// The ConfigMap each mounted directory holds: (ConfigMap, directory).
    config_maps: Vec<(String, PathBuf)>,
    uid: u64,
    gid: u64,
    /// The container's environment, resolved.
    pub env: Vec<(String, String)>,
    /// The container's arguments.
    pub args: Vec<String>,
    generation: AtomicU32,
}

impl Pod {
    /// The pod of `rendered`'s Deployment: Secrets' keys from `secrets`
    /// (secret, key, value), the downward API's fields from `fields`
    /// (fieldPath, value).
    pub fn new(
        rendered: &Rendered,
        secrets: &[(&str, &str, &str)],
        fields: &[(&str, &str)],
    ) -> Pod {
        let staging = tempfile::tempdir().expect("tempdir");
        open_to_all(staging.path());
        let container = rendered.container();
        let pod_spec = at(rendered.deployment(), "spec.template.spec");
        let mut pod = Pod {
            staging,
            mounts: Vec::new(),
            empty_dirs: Vec::new(),
            config_maps: Vec::new(),
            uid: security(pod_spec, container, "runAsUser").expect("runAsUser"),
            gid: security(pod_spec, container, "runAsGroup").expect("runAsGroup"),
            env: resolve_env(container, secrets, fields),
            args: seq(at(container, "args"))
                .iter()
                .map(|a| a.as_str().expect("string arg").to_string())
                .collect(),
            generation: AtomicU32::new(0),
        };
        for mount in seq(at(container, "volumeMounts")) {
            let name = str_at(mount, "name").expect("mount name");
            let path = str_at(mount, "mountPath").expect("mountPath").to_string();
            let volume = seq(at(pod_spec, "volumes"))
                .iter()
                .find(|v| str_at(v, "name") == Some(name))
                .unwrap_or_else(|| panic!("no volume {name}"));
            pod.add_volume(rendered, volume, path, secrets);
        }
        pod
    }

    fn add_volume(
        &mut self,
        rendered: &Rendered,
        volume: &Value,
        path: String,
        secrets: &[(&str, &str, &str)],
    ) {
        let dir = self
            .staging
            .path()
            .join(str_at(volume, "name").expect("name"));
        if let Some(config_map) = str_at(volume, "configMap.name") {
            let files = rendered.config_map_files(config_map);
            self.write_generation(&dir, &files);
            self.config_maps.push((config_map.to_string(), dir.clone()));
            self.mounts.push((dir, path));
        } else if let Some(secret) = str_at(volume, "secret.secretName") {
            let files: Vec<(String, String)> = secrets
                .iter()
                .filter(|(s, _, _)| *s == secret)
                .map(|(_, k, v)| (k.to_string(), v.to_string()))
                .collect();
            assert!(
                !files.is_empty(),
                "the test gives no keys of Secret {secret}"
            );
            self.write_generation(&dir, &files);
            self.mounts.push((dir, path));
        } else if !at(volume, "emptyDir").is_null() {
            self.empty_dirs.push(path);
        } else {
            panic!("a volume of a kind the test does not know: {volume:?}");
        }
    }

    /// Writes `files` as a new generation of the volume in `dir` and swaps
    /// `..data` to it, as the kubelet's atomic writer does.
    fn write_generation(&self, dir: &Path, files: &[(String, String)]) {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst);
        let version = format!("..2026_12_07_00_00_00.{generation:09}");
        std::fs::create_dir_all(dir.join(&version)).expect("volume dir");
        open_to_all(dir);
        open_to_all(&dir.join(&version));
        for (key, content) in files {
            std::fs::write(dir.join(&version).join(key), content).expect("write");
            let link = dir.join(key);
            if std::fs::symlink_metadata(&link).is_err() {
                symlink(Path::new("..data").join(key), &link).expect("key symlink");
            }
        }
        let old = std::fs::read_link(dir.join("..data")).ok();
        symlink(&version, dir.join("..data_tmp")).expect("..data_tmp");
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
        if let Some(old) = old {
            std::fs::remove_dir_all(dir.join(old)).expect("remove the old generation");
        }
    }

    /// Updates ConfigMap `name` in every volume that holds it, as the
    /// kubelet does when the ConfigMap changes.
    pub fn update_config_map(&self, name: &str, files: &[(String, String)]) {
        let dirs: Vec<&PathBuf> = self
            .config_maps
            .iter()
            .filter(|(c, _)| c == name)
            .map(|(_, d)| d)
            .collect();
        assert!(!dirs.is_empty(), "no volume holds ConfigMap {name}");
        for dir in dirs {
            self.write_generation(dir, files);
        }
    }

    /// `program` with the container's arguments, run in the pod.
    pub fn command(&self, program: &Path) -> Command {
        self.command_with_args(program, &self.args)
    }

    /// `program` with `args`, run in the pod: as its user, without
    /// capabilities, on a read-only root with its volumes mounted, with
    /// only its environment (and a PATH).
    pub fn command_with_args(&self, program: &Path, args: &[String]) -> Command {
        let mut command = Command::new("unshare");
        command
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(self.script())
            .arg("pod")
            .arg(program)
            .args(args)
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            );
        for (name, value) in &self.env {
            command.env(name, value);
        }
        command
    }

    /// The shell script that builds the pod's filesystem and then becomes
    /// the program (`exec`), so its pid is the program's.
    fn script(&self) -> String {
        let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
        let as_user = format!(
            "setpriv --reuid={} --regid={} --clear-groups",
            self.uid, self.gid
        );
        let mut s = String::from("set -eu\n");
        // Writable layers over /etc and /usr/local/bin, in this namespace
        // only, to make the mount points the pod has there.
        s += "layer=$(mktemp -d)\nmount -t tmpfs tmpfs \"$layer\"\n";
        for (i, dir) in ["/etc", "/usr/local/bin"].iter().enumerate() {
            s += &format!("mkdir \"$layer/u{i}\" \"$layer/w{i}\"\n");
            s += &format!("mount -t overlay overlay -o \"lowerdir={dir},upperdir=$layer/u{i},workdir=$layer/w{i}\" {dir}\n");
        }
        // The program where the image has it (and out of the way of an
        // emptyDir on /tmp, where a checkout may live).
        s += &format!("touch {IN_POD}\nmount --bind \"$1\" {IN_POD}\nshift\n");
        for (dir, path) in &self.mounts {
            s += &format!(
                "mkdir -p {p}\nmount --bind {d} {p}\n",
                p = quote(path),
                d = quote(&dir.to_string_lossy())
            );
        }
        // readOnlyRootFilesystem: every mount read-only.
        s += "for m in $(awk '{print $5}' /proc/self/mountinfo | sort -u); do\n";
        s += "  mount -o remount,bind,ro \"$m\" 2>/dev/null || true\ndone\n";
        for path in &self.empty_dirs {
            s += &format!(
                "mount -t tmpfs -o mode=1777,size=16m tmpfs {}\n",
                quote(path)
            );
        }
        // Shown, not assumed: the pod's user writes nowhere but its emptyDirs.
        let mut read_only = vec![
            "/".to_string(),
            "/etc".into(),
            "/var/tmp".into(),
            "/dev/shm".into(),
            "/run".into(),
        ];
        read_only.extend(self.mounts.iter().map(|(_, p)| p.clone()));
        read_only.push(
            std::env::current_dir()
                .expect("cwd")
                .to_string_lossy()
                .into_owned(),
        );
        for path in read_only {
            s += &format!(
                "if [ -d {p} ] && {as_user} sh -c 'echo > \"$1/.pod-write-test\"' w {p} 2>/dev/null; then echo \"writable in the pod: \"{p} >&2; exit {NOT_READ_ONLY}; fi\n",
                p = quote(&path)
            );
        }
        for path in &self.empty_dirs {
            s += &format!("{as_user} sh -c 'echo > \"$1/.pod-write-test\" && rm \"$1/.pod-write-test\"' w {}\n", quote(path));
        }
        s += &format!(
            "cd /\nexec {as_user} --inh-caps=-all --bounding-set=-all --no-new-privs -- {IN_POD} \"$@\"\n"
        );
        s
    }
}

/// `runAsUser` / `runAsGroup`: the container's, else the pod's.
fn security(pod_spec: &Value, container: &Value, key: &str) -> Option<u64> {
    at(container, &format!("securityContext.{key}"))
        .as_u64()
        .or_else(|| at(pod_spec, &format!("securityContext.{key}")).as_u64())
}

/// The container's `env`, in order, each `$(NAME)` replaced by an earlier
/// variable's value, as the kubelet does.
fn resolve_env(
    container: &Value,
    secrets: &[(&str, &str, &str)],
    fields: &[(&str, &str)],
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    for var in seq(at(container, "env")) {
        let name = str_at(var, "name").expect("env name").to_string();
        let value = if let Some(value) = str_at(var, "value") {
            env.iter().fold(value.to_string(), |v, (n, x)| {
                v.replace(&format!("$({n})"), x)
            })
        } else if let Some(secret) = str_at(var, "valueFrom.secretKeyRef.name") {
            let key = str_at(var, "valueFrom.secretKeyRef.key").expect("key");
            let found = secrets.iter().find(|(s, k, _)| *s == secret && *k == key);
            found
                .unwrap_or_else(|| panic!("the test gives no {secret}/{key}"))
                .2
                .to_string()
        } else if let Some(field) = str_at(var, "valueFrom.fieldRef.fieldPath") {
            let found = fields.iter().find(|(f, _)| *f == field);
            found
                .unwrap_or_else(|| panic!("the test gives no field {field}"))
                .1
                .to_string()
        } else {
            panic!("an env source the test does not know: {var:?}");
        };
        env.push((name, value));
    }
    env
}

/// Makes `path` readable (and traversable) by the pod's user.
fn open_to_all(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}
