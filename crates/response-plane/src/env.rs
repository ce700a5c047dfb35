//! Reading settings from the environment (or anything that looks like it: command-line
//! overrides, a map in tests), strictly: a variable that is set must hold an allowed value,
//! or startup stops with an error naming the variable, its value and what is allowed. Nothing
//! falls back to a default silently. runtime-glue reads its own variables with this too.

use std::ops::RangeInclusive;
use std::str::FromStr;
use std::time::Duration;

use crate::ConfigError;

/// The process environment's value of `var`, if set. A value that is not UTF-8 comes back
/// with U+FFFD in place of its bad bytes: set, and refused by any parser that checks it
/// (naming the variable), where `std::env::var(var).ok()` would have read it as unset and
/// let a default stand in silently.
pub fn var(var: &str) -> Option<String> {
    std::env::var_os(var).map(|value| value.to_string_lossy().into_owned())
}

/// A source of settings by variable name.
pub struct Env<F>(F);

impl<F: Fn(&str) -> Option<String>> Env<F> {
    /// Settings read through `lookup`.
    pub fn new(lookup: F) -> Self {
        Self(lookup)
    }

    /// The process environment.
    pub fn process() -> Env<fn(&str) -> Option<String>> {
        Env(var)
    }

    /// The raw value of `var`, if set.
    pub fn get(&self, var: &str) -> Option<String> {
        (self.0)(var)
    }

    /// `var` as one of `choices` (by exact name), if set.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidEnv`] for any other value.
    pub fn choice<T: Copy>(
        &self,
        var: &'static str,
        choices: &[(&str, T)],
        allowed: &'static str,
    ) -> Result<Option<T>, ConfigError> {
        self.map(var, allowed, |v| {
            choices.iter().find(|(name, _)| *name == v).map(|(_, t)| *t)
        })
    }

    /// `var` as a whole number within `range`, if set: ASCII digits only (no sign, spaces or
    /// fraction).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidEnv`] for anything else.
    pub fn number<T: TryFrom<u64>>(
        &self,
        var: &'static str,
        range: RangeInclusive<u64>,
        allowed: &'static str,
    ) -> Result<Option<T>, ConfigError> {
        self.map(var, allowed, |v| {
            digits(v)
                .filter(|n| range.contains(n))
                .and_then(|n| T::try_from(n).ok())
        })
    }

    /// `var` as a whole number of milliseconds up to `max_ms`, if set.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidEnv`] for anything else.
    pub fn millis(
        &self,
        var: &'static str,
        max_ms: u64,
        allowed: &'static str,
    ) -> Result<Option<Duration>, ConfigError> {
        Ok(self
            .number::<u64>(var, 0..=max_ms, allowed)?
            .map(Duration::from_millis))
    }

    /// `var` parsed with [`FromStr`], if set.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidEnv`] when it does not parse.
    pub fn parsed<T: FromStr>(
        &self,
        var: &'static str,
        allowed: &'static str,
    ) -> Result<Option<T>, ConfigError> {
        self.map(var, allowed, |v| v.parse().ok())
    }

    pub(crate) fn map<T>(
        &self,
        var: &'static str,
        allowed: &'static str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<Option<T>, ConfigError> {
        let Some(value) = self.get(var) else {
            return Ok(None);
        };
        match parse(&value) {
            Some(t) => Ok(Some(t)),
            None => Err(ConfigError::InvalidEnv {
                var,
                value,
                allowed,
            }),
        }
    }
}

/// A non-empty string of ASCII digits as a number (no sign, no spaces, no fraction).
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(value: &'static str) -> Env<impl Fn(&str) -> Option<String>> {
        Env::new(move |_: &str| Some(value.to_owned()))
    }

    #[test]
    fn numbers_are_plain_digits_within_their_range() {
        assert_eq!(
            env("42").number::<u16>("V", 0..=100, "a").unwrap(),
            Some(42)
        );
        for bad in ["", "+1", "-1", " 1", "1.0", "101", "0x10"] {
            let err = env(bad).number::<u16>("V", 0..=100, "0..=100").unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("invalid V={bad:?}: 0..=100"),
                "{bad:?}"
            );
        }
        let unset = Env::new(|_: &str| None::<String>);
        assert_eq!(unset.number::<u16>("V", 0..=100, "a").unwrap(), None);
    }

    #[test]
    fn choices_match_exactly() {
        let choices = [("tcp", 1), ("velo", 2)];
        assert_eq!(env("velo").choice("V", &choices, "a").unwrap(), Some(2));
        assert!(env("Velo").choice("V", &choices, "a").is_err());
        assert!(env("").choice("V", &choices, "a").is_err());
    }
}
