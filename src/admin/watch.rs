//! `server.watch_config`: notices that the configuration file changed, so
//! that it is reloaded as on `SIGHUP`. The file is polled by content, not
//! watched by inode: a Kubernetes ConfigMap is updated by swapping a
//! symlink (`..data`) over a new directory, which leaves the old inode
//! unchanged and would blind an inotify watch on it. A change is taken once
//! the file reads the same twice in a row, so an editor's half-written file
//! is not loaded; `touch` or a swap to the same content is no change.
//! The files the configuration names as its own (the rate-limit service's
//! rules) are watched with it, as one.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the file is read.
pub(crate) const POLL: Duration = Duration::from_millis(500);

/// The state of one watched file between polls.
pub(crate) struct ConfigWatch {
    path: PathBuf,
    /// The rules files or directories watched with the file.
    also: Vec<PathBuf>,
    /// The content last loaded (or refused): a reload is due when the file
    /// differs from it.
    loaded: Option<u64>,
    /// The content at the previous poll.
    previous: Option<u64>,
}

impl ConfigWatch {
    /// Watches `path`, taking its content now as the content loaded.
    pub fn new(path: &Path) -> Self {
        let now = fingerprint(path, &[]);
        ConfigWatch {
            path: path.to_path_buf(),
            also: Vec::new(),
            loaded: now,
            previous: now,
        }
    }

    /// Watches `also` (files, or directories of rules files) with the file
    /// from now on. A new set is taken as loaded as it is now: the reload
    /// that named it has read it.
    pub fn also(&mut self, also: Vec<PathBuf>) {
        if also != self.also {
            self.also = also;
            self.reloaded();
        }
    }

    /// Reads the file: true when it differs from what was loaded and read
    /// the same at the previous poll (a reload is due; it is then taken as
    /// loaded, so a refused file is reported once, not at every poll). A
    /// file that cannot be read (mid-swap, deleted) is no change.
    pub fn changed(&mut self) -> bool {
        let now = fingerprint(&self.path, &self.also);
        let stable = now.is_some() && now == self.previous;
        self.previous = now;
        if stable && now != self.loaded {
            self.loaded = now;
            return true;
        }
        false
    }

    /// Takes the file's content now as loaded: called just before a reload
    /// for another reason (`SIGHUP`) reads it, never after — a change made
    /// while that reload ran would be taken as loaded and never reloaded.
    pub fn reloaded(&mut self) {
        self.loaded = fingerprint(&self.path, &self.also);
        self.previous = self.loaded;
    }
}

/// A hash of the file's bytes (following symlinks) and of the names and
/// bytes of the rules files in `also`; `None` when one cannot be read.
fn fingerprint(path: &Path, also: &[PathBuf]) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    std::fs::read(path).ok()?.hash(&mut hasher);
    for place in also {
        for file in crate::config::rls::rule_files(place).ok()? {
            file.hash(&mut hasher);
            std::fs::read(&file).ok()?.hash(&mut hasher);
        }
    }
    Some(hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_taken_once_it_reads_the_same_twice_and_only_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.yaml");
        std::fs::write(&path, "a").unwrap();
        let mut watch = ConfigWatch::new(&path);
        assert!(!watch.changed());
        std::fs::write(&path, "b").unwrap();
        assert!(!watch.changed(), "taken before it settled");
        assert!(watch.changed());
        assert!(!watch.changed(), "taken twice");
        // Back and forth within one poll, or the same bytes again: nothing.
        std::fs::write(&path, "b").unwrap();
        assert!(!watch.changed());
        // Gone for a moment (a swap): no change, then the new content.
        std::fs::remove_file(&path).unwrap();
        assert!(!watch.changed());
        std::fs::write(&path, "c").unwrap();
        assert!(!watch.changed());
        assert!(watch.changed());
        // A SIGHUP reload of new content: the watch does not reload it again.
        std::fs::write(&path, "d").unwrap();
        watch.reloaded();
        assert!(!watch.changed());
        assert!(!watch.changed());
        // A change made while that reload ran is still a change.
        watch.reloaded();
        std::fs::write(&path, "e").unwrap();
        assert!(!watch.changed());
        assert!(watch.changed());
    }

    #[test]
    fn a_rules_file_added_or_changed_in_a_watched_directory_is_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.yaml");
        let rules = dir.path().join("rules");
        std::fs::create_dir(&rules).unwrap();
        std::fs::write(&path, "a").unwrap();
        std::fs::write(rules.join("a.yaml"), "domain: a").unwrap();
        let mut watch = ConfigWatch::new(&path);
        watch.also(vec![rules.clone()]);
        assert!(!watch.changed());
        assert!(!watch.changed(), "naming the directory is no change");
        std::fs::write(rules.join("b.yaml"), "domain: b").unwrap();
        assert!(!watch.changed());
        assert!(watch.changed());
        std::fs::write(rules.join("a.yaml"), "domain: c").unwrap();
        assert!(!watch.changed());
        assert!(watch.changed());
        // Hidden entries (a ConfigMap's `..data` swap) are not rules.
        std::fs::write(rules.join(".swap"), "x").unwrap();
        assert!(!watch.changed());
        assert!(!watch.changed());
    }
}
