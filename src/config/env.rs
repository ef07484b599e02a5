//! `${VAR}` and `${VAR:-default}` expansion of the raw configuration text.
//!
//! Expansion happens line by line before YAML parsing, so line numbers in later
//! error messages still point at the file as written. A `$` that does not start
//! `${` is left alone. Comment lines are copied verbatim, so an unset variable
//! named only in a comment is not an error.

/// A `${VAR}` with no default whose variable is not set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsetVariable {
    /// The variable's name.
    pub name: String,
    /// 1-based line of the `${`.
    pub line: usize,
    /// 1-based column of the `${`.
    pub column: usize,
}

/// An unterminated `${` (no closing `}` on the same line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpandError {
    /// The variable is not set and has no default.
    Unset(UnsetVariable),
    /// `${` without `}` on the same line, at (line, column), both 1-based.
    Unterminated(usize, usize),
}

/// Expands `${VAR}` / `${VAR:-default}` using `lookup` for variable values.
///
/// Guarantees: the output has the same number of lines as the input unless a
/// variable's value itself contains a newline; text outside `${...}` is unchanged.
pub fn expand(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, ExpandError> {
    let mut out = String::with_capacity(text.len());
    for (index, line) in text.split_inclusive('\n').enumerate() {
        if line.trim_start().starts_with('#') {
            out.push_str(line);
            continue;
        }
        let mut rest = line;
        let mut consumed = 0;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                return Err(ExpandError::Unterminated(
                    index + 1,
                    line[..consumed + start].chars().count() + 1,
                ));
            };
            let body = &after[..end];
            let (name, default) = match body.split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (body, None),
            };
            match lookup(name).filter(|v| !v.is_empty() || default.is_none()) {
                Some(value) => out.push_str(&value),
                None => match default {
                    Some(default) => out.push_str(default),
                    None => {
                        return Err(ExpandError::Unset(UnsetVariable {
                            name: name.to_string(),
                            line: index + 1,
                            column: line[..consumed + start].chars().count() + 1,
                        }))
                    }
                },
            }
            let advance = start + 2 + end + 1;
            consumed += advance;
            rest = &rest[advance..];
        }
        out.push_str(rest);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "SET" => Some("value".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expands_set_variables_and_defaults() {
        assert_eq!(expand("a: ${SET}\n", env).unwrap(), "a: value\n");
        assert_eq!(expand("a: ${NOPE:-x:y}\n", env).unwrap(), "a: x:y\n");
        assert_eq!(
            expand("a: ${SET:-x}${SET}\n", env).unwrap(),
            "a: valuevalue\n"
        );
        // `:-` also applies to a set-but-empty variable, as in the shell.
        assert_eq!(expand("a: ${EMPTY:-d}\n", env).unwrap(), "a: d\n");
        assert_eq!(expand("a: ${EMPTY}\n", env).unwrap(), "a: \n");
        assert_eq!(expand("cost: $5\n", env).unwrap(), "cost: $5\n");
    }

    #[test]
    fn unset_variable_reports_its_position() {
        let err = expand("x: 1\n  y: ${MISSING}\n", env).unwrap_err();
        assert_eq!(
            err,
            ExpandError::Unset(UnsetVariable {
                name: "MISSING".into(),
                line: 2,
                column: 6
            })
        );
        assert_eq!(
            expand("a: ${OPEN\n", env).unwrap_err(),
            ExpandError::Unterminated(1, 4)
        );
    }

    #[test]
    fn comments_are_not_expanded() {
        assert_eq!(expand("  # ${MISSING}\n", env).unwrap(), "  # ${MISSING}\n");
    }
}
