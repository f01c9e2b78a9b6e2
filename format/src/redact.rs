//! Keeping secrets out of messages: passwords in URLs (`https://user:pw@host`)
//! and query values (SAS tokens, presigned signatures) become `***` in
//! every URL that reaches an error, a log line, `--json` output or `Debug`.

/// `url` with its password and every query value replaced by `***`; text
/// that is not a URL (a local path) comes back unchanged.
pub fn url(url: &str) -> String {
    if !url.contains("://") {
        return url.to_string();
    }
    let Ok(mut parsed) = url::Url::parse(url) else {
        // Not parseable: cut everything that could hold a secret.
        return cut_secrets(url);
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    if let Some(query) = parsed.query().filter(|q| !q.is_empty()) {
        let redacted: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) => format!("{k}=***"),
                None => pair.to_string(),
            })
            .collect();
        parsed.set_query(Some(&redacted.join("&")));
    }
    parsed.to_string()
}

/// A URL that did not parse: drop its userinfo and query entirely.
fn cut_secrets(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(q) = out.find('?') {
        out.truncate(q);
        out.push_str("?***");
    }
    if let Some(scheme_end) = out.find("://") {
        let rest = &out[scheme_end + 3..];
        let host_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..host_end].rfind('@') {
            out = format!("{}***@{}", &out[..scheme_end + 3], &rest[at + 1..]);
        }
    }
    out
}

/// `text` with every URL in it redacted as [`url()`] does (for messages of
/// other libraries, which may quote the URL of a failed request).
pub fn text(text: &str) -> String {
    if !text.contains("://") {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // The scheme: letters, digits, '+', '-', '.' before "://".
        let start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |i| i + 1);
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || matches!(c, ')' | '"' | '\'' | '>' | ','))
            .map_or(rest.len(), |i| at + i);
        out.push_str(&rest[..start]);
        out.push_str(&url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_and_query_values_are_hidden() {
        assert_eq!(
            url("https://alice:s3cr3tpass@host/ds"),
            "https://alice:***@host/ds"
        );
        let sas = url("az://c/ds?sv=2022&sig=abc%2Bdef&se=2030");
        assert!(!sas.contains("abc") && sas.contains("sig=***"), "{sas}");
        assert_eq!(url("/data/ds"), "/data/ds");
        assert_eq!(url("s3://bucket/ds"), "s3://bucket/ds");
        let t = text("error sending request for url (http://h:1/x?sig=SECRET&a=b): refused");
        assert!(!t.contains("SECRET") && t.ends_with("): refused"), "{t}");
        assert!(!text("at https://u:pw@h/p, then").contains("pw"));
        assert!(!cut_secrets("x://u:pw@h/p?sig=1").contains("pw"));
    }
}
