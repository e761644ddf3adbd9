//! What is wrong with a config file, each problem with its line and column
//! (all reported at once, so `valve --check` lists everything to fix).

use std::fmt;
use std::path::PathBuf;

/// One problem, where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based; 0 when the problem has no place in the file (a flag's value).
    pub line: usize,
    pub col: usize,
    pub message: String,
}

/// Everything wrong with one config file.
#[derive(Debug, Clone)]
pub struct Problems {
    pub file: PathBuf,
    pub list: Vec<Problem>,
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.list.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            match p.line {
                0 => write!(f, "{}: {}", self.file.display(), p.message)?,
                line => write!(f, "{}:{}:{}: {}", self.file.display(), line, p.col, p.message)?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// 1-based line and column of a byte offset.
pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, col)
}
