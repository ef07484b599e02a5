//! The config loader on any text: it loads, or refuses with problems, each
//! of which has a message and, where it has a position, one inside the
//! text (line ≥ 1, column ≥ 1), lines counted as YAML counts them (a lone
//! `\r`, NEL, LS and PS break lines too). Never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::config::Config;
use std::path::Path;

fuzz_target!(|text: &str| {
    let lines = 1 + yaml_line_breaks(text);
    match Config::from_text(Path::new("fuzz.yaml"), text, |_| None) {
        Ok(_) => {}
        Err(error) => {
            assert!(!error.problems.is_empty(), "refused without a problem");
            for problem in &error.problems {
                assert!(!problem.message.is_empty());
                if let Some((line, column)) = problem.position {
                    assert!(line >= 1 && column >= 1, "{problem:?}");
                    assert!(line <= lines + 1, "line {line} of {lines}: {problem:?}");
                }
            }
        }
    }
});

/// How many line breaks YAML sees in `text`: `\r\n` is one.
fn yaml_line_breaks(text: &str) -> usize {
    let mut breaks = 0;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {
                chars.next_if_eq(&'\n');
                breaks += 1;
            }
            '\n' | '\u{85}' | '\u{2028}' | '\u{2029}' => breaks += 1,
            _ => {}
        }
    }
    breaks
}
