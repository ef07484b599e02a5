//! Where each node of a YAML document starts, by its path (`routes[0].limits[1].window`).
//!
//! serde_yaml reports positions for syntax and type errors but not for the
//! checks sluice makes after deserialization (duplicate names, unknown upstreams,
//! zero limits). This index lets those checks name a path and still be reported
//! as `file:line:column`.

use std::collections::HashMap;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// A 1-based line and column in the configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
}

/// Map from a node's path to the position where its value starts.
#[derive(Debug, Default)]
pub(crate) struct PositionIndex {
    positions: HashMap<String, Position>,
}

impl PositionIndex {
    /// Indexes `text`. A document that does not parse yields an empty index
    /// (serde_yaml reports the syntax error with its own position).
    pub fn build(text: &str) -> Self {
        let mut builder = Builder::default();
        let mut parser = Parser::new_from_str(text);
        if parser.load(&mut builder, false).is_err() {
            return Self::default();
        }
        Self {
            positions: builder.positions,
        }
    }

    /// The position of `path`, or of its nearest indexed ancestor.
    pub fn find(&self, path: &str) -> Option<Position> {
        let mut path = path;
        loop {
            if let Some(pos) = self.positions.get(path) {
                return Some(*pos);
            }
            let cut = path.rfind(['.', '['])?;
            path = &path[..cut];
        }
    }
}

enum Frame {
    Mapping {
        path: String,
        pending_key: Option<(String, Marker)>,
        expecting_key: bool,
    },
    Sequence {
        path: String,
        next_index: usize,
    },
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    positions: HashMap<String, Position>,
}

impl Builder {
    /// Path for the node that starts now at `mark`, advancing the parent's
    /// state, and the position to record for it: the node's own, except for a
    /// block collection under a key, which is reported at its key's line.
    /// Returns `None` when the node is a mapping key.
    fn next_node(&mut self, scalar_key: Option<&str>, mark: Marker) -> Option<(String, Marker)> {
        match self.stack.last_mut() {
            None => Some((String::new(), mark)),
            Some(Frame::Sequence { path, next_index }) => {
                let p = format!("{path}[{next_index}]");
                *next_index += 1;
                Some((p, mark))
            }
            Some(Frame::Mapping {
                path,
                pending_key,
                expecting_key,
            }) => {
                if *expecting_key {
                    *expecting_key = false;
                    *pending_key = Some((scalar_key.unwrap_or("?").to_string(), mark));
                    None
                } else {
                    *expecting_key = true;
                    let (key, key_mark) = pending_key.take().unwrap_or((String::new(), mark));
                    let p = if path.is_empty() {
                        key
                    } else {
                        format!("{path}.{key}")
                    };
                    let at = if scalar_key.is_none() && mark.line() > key_mark.line() {
                        key_mark
                    } else {
                        mark
                    };
                    Some((p, at))
                }
            }
        }
    }

    fn record(&mut self, path: &str, mark: Marker) {
        self.positions.entry(path.to_string()).or_insert(Position {
            line: mark.line(),
            column: mark.col() + 1,
        });
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::Scalar(value, ..) => {
                if let Some((path, at)) = self.next_node(Some(&value), mark) {
                    self.record(&path, at);
                }
            }
            Event::Alias(_) => {
                if let Some((path, at)) = self.next_node(Some("*alias"), mark) {
                    self.record(&path, at);
                }
            }
            Event::MappingStart(..) => {
                let (path, at) = self.next_node(None, mark).unwrap_or((String::new(), mark));
                self.record(&path, at);
                self.stack.push(Frame::Mapping {
                    path,
                    pending_key: None,
                    expecting_key: true,
                });
            }
            Event::SequenceStart(..) => {
                let (path, at) = self.next_node(None, mark).unwrap_or((String::new(), mark));
                self.record(&path, at);
                self.stack.push(Frame::Sequence {
                    path,
                    next_index: 0,
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_values() {
        let text = "server:\n  threads: 2\nroutes:\n  - name: a\n    limits:\n      - name: x\n        window: 0s\n";
        let index = PositionIndex::build(text);
        assert_eq!(
            index.find("server.threads"),
            Some(Position {
                line: 2,
                column: 12
            })
        );
        assert_eq!(
            index.find("routes[0].name"),
            Some(Position {
                line: 4,
                column: 11
            })
        );
        assert_eq!(
            index.find("routes[0].limits[0].window"),
            Some(Position {
                line: 7,
                column: 17
            })
        );
        // Missing leaf: falls back to the nearest ancestor.
        assert_eq!(
            index.find("routes[0].limits[0].cost").map(|p| p.line),
            Some(6)
        );
    }
}
