//! Who called valve's admin pages, and how they showed it.

/// Who called, once known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Who {
    /// An operator: the token, an admin key, or a listed user of the proxy's.
    Operator(String),
    /// A publishing key that is not an admin key: its own apps only.
    Publisher(String),
}

impl Who {
    pub fn is_operator(&self) -> bool {
        matches!(self, Who::Operator(_))
    }

    /// How the access log names it (never a secret).
    pub fn label(&self) -> String {
        match self {
            Who::Operator(how) => format!("operator ({how})"),
            Who::Publisher(key) => format!("key {key}"),
        }
    }

    /// Whether it may see and change an app whose owner (the key that
    /// published it) is `owner`.
    pub fn owns(&self, owner: Option<&str>) -> bool {
        match self {
            Who::Operator(_) => true,
            Who::Publisher(key) => owner == Some(key.as_str()),
        }
    }
}

/// How the caller showed who it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shown {
    /// `Authorization` (a token or key) or the proxy's headers: no browser
    /// sends those to another site on its own.
    Credential,
    /// The session cookie, whose POSTs need this session's CSRF token.
    Cookie { csrf: String },
}
