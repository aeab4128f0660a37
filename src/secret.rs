//! Credentials from files or the environment, and URLs with their passwords
//! taken out before they reach a log line or an error message.

use std::path::Path;

/// A credential: the file's content (surrounding whitespace trimmed), else
/// the environment variable `env`, else the command-line value (visible to
/// every user of the machine in `ps`, so a warning says so). `what` names
/// the flags in messages; the value itself never appears in one.
pub fn credential(
    what: &str,
    file: Option<&Path>,
    env: &str,
    flag: Option<&str>,
) -> Result<Option<String>, String> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--{what}-file {}: {e}", path.display()))?;
        warn_if_readable_by_others(what, path);
        let value = text.trim().to_string();
        if value.is_empty() {
            return Err(format!(
                "--{what}-file {}: the file is empty",
                path.display()
            ));
        }
        return Ok(Some(value));
    }
    if let Ok(value) = std::env::var(env)
        && !value.is_empty()
    {
        return Ok(Some(value));
    }
    match flag.filter(|v| !v.is_empty()) {
        Some(value) => {
            tracing::warn!(
                "--{what} on the command line is visible to every user of this machine; \
                 use --{what}-file or {env}"
            );
            Ok(Some(value.to_string()))
        }
        None => Ok(None),
    }
}

#[cfg(unix)]
fn warn_if_readable_by_others(what: &str, path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            path = %path.display(),
            "--{what}-file is readable by other users; chmod 600 it"
        );
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_what: &str, _path: &Path) {}

/// `url` with any password replaced by `***` (`redis://user:***@host`), for
/// logs and errors. Text that is not a URL with credentials is returned as is.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    // The authority ends at the first '/', '?' or '#'; credentials are what
    // precedes its last '@'.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let user = match authority[..at].split_once(':') {
        Some((user, _password)) => format!("{user}:***"),
        // `redis://secret@host`: a lone field is the password for Redis.
        None => "***".to_string(),
    };
    format!("{}{user}{}", &url[..scheme_end + 3], &rest[at..])
}

/// `url` with `password` as its credentials, unless it carries its own
/// (`redis://host:6379` → `redis://:PASSWORD@host:6379`, percent-encoded).
pub fn with_password(url: &str, password: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if rest[..authority_end].contains('@') {
        return url.to_string();
    }
    let mut encoded = String::with_capacity(password.len());
    for b in password.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    format!("{}:{encoded}@{rest}", &url[..scheme_end + 3])
}

/// Every URL-looking word of `text` passed through [`redact_url`]: for
/// error messages from libraries that echo the URL they were given.
pub fn redact_urls_in(text: &str, urls: &[String]) -> String {
    let mut out = text.to_string();
    for url in urls {
        out = out.replace(url.as_str(), &redact_url(url));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_survive_redaction() {
        assert_eq!(
            redact_url("redis://app:s3cret@10.0.0.1:6379/2"),
            "redis://app:***@10.0.0.1:6379/2"
        );
        assert_eq!(
            redact_url("rediss://s3cret@host:6380"),
            "rediss://***@host:6380"
        );
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact_url("not a url"), "not a url");
        // An '@' in the path is not a credential separator.
        assert_eq!(redact_url("http://h/a@b"), "http://h/a@b");
        // Passwords may hold '@': credentials end at the last one.
        assert_eq!(redact_url("redis://u:p@ss@h:1"), "redis://u:***@h:1");
        assert_eq!(
            with_password("redis://h:1/0", "p@ss word"),
            "redis://:p%40ss%20word@h:1/0"
        );
        assert_eq!(with_password("redis://u:own@h:1", "x"), "redis://u:own@h:1");
        let message = "connecting to redis://u:pw@h:1 failed";
        let urls = ["redis://u:pw@h:1".to_string()];
        assert!(!redact_urls_in(message, &urls).contains("pw"));
    }

    #[test]
    fn a_credential_comes_from_its_file_trimmed_and_an_empty_file_is_an_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("token");
        std::fs::write(&path, "  abc123\n").expect("write");
        let got = credential("admin-token", Some(&path), "MERIDIAN_TEST_UNSET_ENV", None);
        assert_eq!(got, Ok(Some("abc123".to_string())));
        std::fs::write(&path, "\n").expect("write");
        let err = credential("admin-token", Some(&path), "MERIDIAN_TEST_UNSET_ENV", None)
            .expect_err("empty file");
        assert!(
            err.contains("--admin-token-file") && err.contains("empty"),
            "{err}"
        );
        let missing = dir.path().join("nope");
        let err = credential(
            "admin-token",
            Some(&missing),
            "MERIDIAN_TEST_UNSET_ENV",
            None,
        )
        .expect_err("missing file");
        assert!(err.contains("nope"), "{err}");
    }
}
