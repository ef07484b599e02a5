//! The operator console at `/console/` (docs/console.md): one page, one
//! script and one style sheet, built into the binary. The page reads the
//! admin APIs with the admin token, which it keeps in the tab's session
//! storage; it renders every value as text (the script never writes
//! markup), and the headers every admin answer carries ([`SECURITY_HEADERS`])
//! forbid inline script, framing, sniffing, referrers and caching.

/// The page.
const INDEX: &str = include_str!("index.html");
/// Its script: every chart, table and action.
const SCRIPT: &str = include_str!("console.js");
/// Its style sheet.
const STYLE: &str = include_str!("console.css");

/// The Content-Security-Policy of every admin answer: only the console's
/// own script and style, fetches to the admin listener itself, no inline
/// script or style, no plugin, no `<base>`, no form sent anywhere, no frame.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; \
    base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The headers every admin answer carries, console pages and API answers
/// alike.
pub const SECURITY_HEADERS: [(&str, &str); 7] = [
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-resource-policy", "same-origin"),
];

/// The console's file at `path` (under `/console/`) and its content type;
/// `None` for any other path.
pub fn asset(path: &str) -> Option<(&'static str, &'static str)> {
    match path {
        "/console/" | "/console/index.html" => Some(("text/html; charset=utf-8", INDEX)),
        "/console/console.js" => Some(("text/javascript; charset=utf-8", SCRIPT)),
        "/console/console.css" => Some(("text/css; charset=utf-8", STYLE)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_holds_no_inline_script_or_style() {
        let page = INDEX.to_ascii_lowercase();
        // Every <script> names its source; no element carries a handler or a
        // style attribute (the policy would refuse them anyway).
        for (i, _) in page.match_indices("<script") {
            let tag = &page[i..i + page[i..].find('>').unwrap_or(0)];
            assert!(tag.contains("src=\"console.js\""), "inline script: {tag}");
        }
        assert!(!page.contains(" onload=") && !page.contains(" onclick="));
        assert!(!page.contains("style=") && !page.contains("<style"));
    }

    #[test]
    fn the_script_never_writes_markup() {
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!SCRIPT.contains(sink), "console.js uses {sink}");
        }
        assert!(!SCRIPT.contains("new Function"));
    }
}
