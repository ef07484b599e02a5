//! The API-key header, any bytes, against the example consumers file: a
//! request is a consumer exactly when its key's SHA-256 is one of that
//! consumer's lines; any other key is unknown (and counted against the
//! client's failures), never anonymous and never another consumer.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::config::consumers::key_hash;
use sluice::config::Config;
use sluice::policy::identity::{Identity, User};
use sluice::request::parts::PartValue;
use std::borrow::Cow;
use std::path::Path;
use std::sync::OnceLock;

const CONSUMERS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../conf/examples/consumers.yaml"
);

fn identity() -> &'static Identity {
    static IDENTITY: OnceLock<Identity> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let text = format!(
            "identity:\n  api_key: {{ header: x-api-key, file: \"{CONSUMERS}\" }}\nroutes:\n  - name: r\n    respond: {{}}\n"
        );
        let config = Config::from_text(Path::new("fuzz.yaml"), &text, |_| None).expect("config");
        let metrics = sluice::observe::metrics::Metrics::new().expect("metrics");
        Identity::new(&config.identity, "sluice:", &metrics.identity).expect("identity")
    })
}

/// Each `sha256:` line of the consumers file with its consumer's id.
fn lines() -> &'static [(String, String)] {
    static LINES: OnceLock<Vec<(String, String)>> = OnceLock::new();
    LINES.get_or_init(|| {
        let text = std::fs::read_to_string(CONSUMERS).expect("the consumers file");
        let mut owner = String::new();
        let mut lines = Vec::new();
        for line in text.lines().map(str::trim) {
            if let Some(id) = line.strip_prefix("- id: ") {
                owner = id.trim().to_string();
            }
            if let Some(at) = line.find("sha256:") {
                let hash: String = line[at..].chars().take(7 + 64).collect();
                lines.push((hash, owner.clone()));
            }
        }
        lines
    })
}

/// The consumer whose file line is the SHA-256 of `key`, if any.
fn owner(key: &[u8]) -> Option<&'static str> {
    let hex: String = key_hash(key).iter().map(|b| format!("{b:02x}")).collect();
    let line = format!("sha256:{hex}");
    lines()
        .iter()
        .find(|(hash, _)| *hash == line)
        .map(|(_, owner)| owner.as_str())
}

fuzz_target!(|sent: &[u8]| {
    let keys = identity().api_keys().expect("API keys");
    let established = keys.establish_local(PartValue::One(Cow::Borrowed(sent)));
    match (established.user, owner(sent)) {
        (User::Known(id), Some(owner)) => assert_eq!(&*id, owner.as_bytes()),
        (User::Known(id), None) => panic!("{sent:?} made consumer {id:?}"),
        (_, Some(owner)) if !sent.is_empty() => panic!("{owner}'s key was refused"),
        (User::Invalid(_), _) => assert!(established.unknown_key || sent.is_empty()),
        (User::Absent, _) => panic!("a sent key made no identity at all"),
    }
});
