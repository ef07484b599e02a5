//! What the running configuration is and how its last reload went, for
//! `/v1/status` and the console: the file, its generation (1 at start, one
//! more on each reload that took), when it was loaded, and the last
//! reload's outcome — the changes it applied, or the problems that refused
//! it at their `file:line:column`.

use crate::sync::Locked;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// The running configuration's record, shared by the reloader (which
/// writes it) and the admin listener (which reads it).
#[derive(Debug)]
pub struct ConfigStatus {
    path: PathBuf,
    record: Mutex<Record>,
}

#[derive(Debug)]
struct Record {
    generation: u64,
    loaded_at: SystemTime,
    last_reload: Option<Reload>,
}

/// One reload's outcome.
#[derive(Debug, Clone)]
struct Reload {
    at: SystemTime,
    cause: String,
    /// The changes applied, or the problems that refused it.
    outcome: Result<Vec<String>, Vec<String>>,
    /// Settings changed in the file that keep their running value.
    needs_restart: Vec<String>,
}

impl ConfigStatus {
    /// The record of `path`, loaded now as generation 1.
    pub fn new(path: &Path) -> Self {
        ConfigStatus {
            path: path.to_path_buf(),
            record: Mutex::new(Record {
                generation: 1,
                loaded_at: SystemTime::now(),
                last_reload: None,
            }),
        }
    }

    /// Records a reload (for `cause`) that took: the next generation,
    /// loaded now, with the `changes` it applied and the settings that
    /// `need_restart`.
    pub fn reloaded(&self, cause: &str, changes: Vec<String>, needs_restart: Vec<String>) {
        let now = SystemTime::now();
        let mut record = self.record.locked();
        record.generation += 1;
        record.loaded_at = now;
        record.last_reload = Some(Reload {
            at: now,
            cause: cause.to_string(),
            outcome: Ok(changes),
            needs_restart,
        });
    }

    /// Records a reload (for `cause`) refused for `problems` (one line
    /// each, `file:line:column: message` where the position is known); the
    /// running generation stays.
    pub fn refused(&self, cause: &str, problems: Vec<String>) {
        let mut record = self.record.locked();
        record.last_reload = Some(Reload {
            at: SystemTime::now(),
            cause: cause.to_string(),
            outcome: Err(problems.iter().map(|p| redact_credentials(p)).collect()),
            needs_restart: Vec::new(),
        });
    }

    /// The generation now.
    pub fn generation(&self) -> u64 {
        self.record.locked().generation
    }

    /// The record as JSON: `path`, `generation`, `loaded_at` (Unix
    /// seconds), and `last_reload` (`null` before the first) with `at`,
    /// `cause`, `result` (`success` or `failure`), `changes`,
    /// `needs_restart` and `problems`.
    pub fn to_json(&self) -> serde_json::Value {
        let record = self.record.locked();
        let last_reload = record.last_reload.as_ref().map(|reload| {
            let (result, changes, problems) = match &reload.outcome {
                Ok(changes) => ("success", changes.clone(), Vec::new()),
                Err(problems) => ("failure", Vec::new(), problems.clone()),
            };
            json!({
                "at": unix_seconds(reload.at),
                "cause": reload.cause,
                "result": result,
                "changes": changes,
                "needs_restart": reload.needs_restart,
                "problems": problems,
            })
        });
        json!({
            "path": self.path.display().to_string(),
            "generation": record.generation,
            "loaded_at": unix_seconds(record.loaded_at),
            "last_reload": last_reload,
        })
    }
}

/// `at` in seconds since the Unix epoch (0 before it).
pub(crate) fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| (d.as_millis() as f64) / 1000.0)
}

/// `text` with the user and password of any URL in it replaced by `***`:
/// a refused `redis://user:password@host` must not show its password on a
/// page.
pub(crate) fn redact_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, word) in text.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&redact_word(word));
    }
    out
}

/// One space-separated word of [`redact_credentials`].
fn redact_word(word: &str) -> String {
    let Some(at) = word.rfind('@') else {
        return word.to_string();
    };
    let start = word.find("://").map_or_else(
        // No scheme separator: whatever precedes a `:` before the `@`
        // (`host:secret@…`, `redis:/:secret@…`) may be a password.
        || word[..at].find(':').map(|colon| colon + 1),
        |scheme| Some(scheme + 3),
    );
    match start {
        Some(start) if start <= at => format!("{}***{}", &word[..start], &word[at..]),
        _ => word.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_with_credentials_is_shown_without_them() {
        assert_eq!(
            redact_credentials("`rediss://app:s3cret@redis:6380/0` is not a Redis URL"),
            "`rediss://***@redis:6380/0` is not a Redis URL"
        );
        assert_eq!(
            redact_credentials("`redis:/:pa@ss@host` is bad"),
            "`redis:***@host` is bad"
        );
        assert_eq!(
            redact_credentials("conf.yaml:3:5: unknown key `url`"),
            "conf.yaml:3:5: unknown key `url`"
        );
        assert_eq!(
            redact_credentials("mail ops@example.com"),
            "mail ops@example.com"
        );
    }

    #[test]
    fn generations_count_reloads_that_took() {
        let status = ConfigStatus::new(Path::new("/etc/sluice.yaml"));
        assert_eq!(status.generation(), 1);
        status.refused("SIGHUP", vec!["/etc/sluice.yaml:3:7: bad".into()]);
        assert_eq!(status.generation(), 1);
        let json = status.to_json();
        assert_eq!(json["last_reload"]["result"], "failure");
        assert_eq!(
            json["last_reload"]["problems"][0],
            "/etc/sluice.yaml:3:7: bad"
        );
        status.reloaded("SIGHUP", vec!["route api: limit changed".into()], vec![]);
        assert_eq!(status.generation(), 2);
        let json = status.to_json();
        assert_eq!(json["last_reload"]["result"], "success");
        assert_eq!(
            json["last_reload"]["problems"].as_array().map(Vec::len),
            Some(0)
        );
    }
}
