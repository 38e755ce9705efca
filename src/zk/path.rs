//! Validation and joining of znode paths and names.

use super::error::ZkError;

/// Longest node name accepted for ids chosen by users (a Kubernetes pod
/// name is at most 253 characters).
pub const MAX_NAME_LEN: usize = 253;

/// Checks that `name` can be one path segment: not empty, no `/`, not `.`
/// or `..`, no control characters, at most [`MAX_NAME_LEN`] bytes.
pub fn validate_name(name: &str) -> Result<(), ZkError> {
    let bad = |reason| {
        Err(ZkError::InvalidPath {
            path: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("a node name cannot be empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad("a node name is at most 253 bytes");
    }
    if name.contains('/') {
        return bad("a node name cannot contain '/'");
    }
    if name == "." || name == ".." {
        return bad("'.' and '..' are not node names");
    }
    if name.chars().any(|c| {
        c.is_control()
            || ('\u{e000}'..='\u{f8ff}').contains(&c)
            || ('\u{fff0}'..='\u{ffff}').contains(&c)
    }) {
        return bad("a node name cannot contain control or reserved characters");
    }
    Ok(())
}

/// Checks that `path` is an absolute znode path: starts with `/`, no empty
/// segment, no trailing `/` (except the root itself), valid segments.
pub fn validate_path(path: &str) -> Result<(), ZkError> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(ZkError::InvalidPath {
            path: path.to_owned(),
            reason: "a path must start with '/'",
        });
    };
    if rest.is_empty() {
        return Ok(());
    }
    for segment in rest.split('/') {
        if segment.is_empty() {
            return Err(ZkError::InvalidPath {
                path: path.to_owned(),
                reason: "a path cannot have an empty segment or end with '/'",
            });
        }
        validate_name(segment).map_err(|e| match e {
            ZkError::InvalidPath { reason, .. } => ZkError::InvalidPath {
                path: path.to_owned(),
                reason,
            },
            other => other,
        })?;
    }
    Ok(())
}

/// `parent/name`, without doubling the `/` below the root.
pub fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// The last segment of a path.
pub fn name_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths() {
        assert!(validate_name("pod-0").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a/b").is_err());
        assert!(validate_name("..").is_err());
        assert!(validate_name(&"x".repeat(254)).is_err());
        assert!(validate_name("a\u{1}b").is_err());
        assert!(validate_path("/").is_ok());
        assert!(validate_path("/a/b").is_ok());
        assert!(validate_path("a/b").is_err());
        assert!(validate_path("/a/").is_err());
        assert!(validate_path("/a//b").is_err());
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
        assert_eq!(name_of("/a/b"), "b");
    }
}
