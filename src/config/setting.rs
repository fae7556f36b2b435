//! What a setting is, and what follows from its one declaration
//! ([`super::catalog`]): its clap argument (flag, variable, help with the
//! range, default), its range check with the errors that name it, and the
//! text of its default and range that `--help` and docs/configuration.md
//! show. [`group!`] makes a struct of settings a clap `Args`.
//!
//! A setting is a flag or the environment variable of the same name
//! (spec §9); its id is its variable, so ids stay unique across the
//! flattened groups and `--help` shows `--expiration-interval
//! <EXPIRATION_INTERVAL>`. A malformed value is refused while clap reads
//! the command line, as one [`ConfigError`] naming the variable (`main`
//! prints it as the one line of an exit 2).

use std::{
    convert::Infallible, ffi::OsStr, fmt, marker::PhantomData, net::SocketAddr, path::PathBuf,
    sync::Arc, time::Duration,
};

use clap::{
    Arg, ArgAction, ArgMatches, Command,
    builder::{TypedValueParser, ValueParser},
};

use super::{
    Compression, ConfigError, Pooler, SaslMechanism, SecurityProtocol, parse::BootstrapServers,
    secret::Secret,
};
use crate::libpq::{ssl::SslMode, url::PgUrl};

/// One setting, declared once in [`super::catalog`].
pub struct Setting<T: Value> {
    /// The variable: `KAFKA_REQUEST_TIMEOUT` (its flag is
    /// `--kafka-request-timeout`). For a flag without a variable, the name
    /// of its declaration only.
    pub(super) variable: &'static str,
    /// `--spread`: a flag without a variable (`seed`'s, `republish`'s).
    pub(super) flag: Option<&'static str>,
    /// One line for `--help`, the range added to it; empty: no help (the
    /// SASL user name and password have had none).
    pub(super) help: &'static str,
    /// The value when the setting is not given; `None`: unset.
    pub(super) default: Option<T::Const>,
    pub(super) values: Values<T>,
    /// `--help` shows no default (an empty one, which means unset).
    pub(super) hide_default: bool,
    /// `--help` never shows its variable's value.
    pub(super) hide_value: bool,
    /// A value may start with `-` (a password: clap's usage error would
    /// quote it).
    pub(super) hyphen_values: bool,
}

/// How a setting's text becomes its value.
pub(super) enum Values<T: Value> {
    /// A parse function; its problem becomes a [`ConfigError`] naming the
    /// setting.
    Parse(fn(&str) -> Result<T, String>),
    /// A value kept in a range, named in every refusal.
    Within {
        range: Range<T::Const>,
        read: fn(&str, &Range<T::Const>) -> Result<T, String>,
        bounds: fn(&Range<T::Const>) -> Bounds,
        /// After the range in `--help` (`, or off`).
        more: &'static str,
    },
    /// clap's own parser (any text, a path).
    Clap(fn() -> ValueParser),
    /// A switch without a value (`--no-worker`): true when given.
    Flag,
}

// Setting<T> holds no `T`, only its declared constant and functions, so it
// copies whatever `T` is (a derive would ask `T: Copy`).
impl<T: Value> Clone for Values<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Value> Copy for Values<T> {}

/// The values a setting accepts, both bounds included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range<T> {
    pub min: T,
    pub max: T,
}

impl<T: AsText> Range<T> {
    /// `100ms to 1h`: the range as `--help`, the docs and the errors write it.
    pub fn text(&self) -> String {
        format!("{} to {}", self.min.as_text(), self.max.as_text())
    }
}

impl<T: PartialOrd> Range<T> {
    pub fn contains(&self, value: &T) -> bool {
        self.min <= *value && *value <= self.max
    }
}

/// A range's bounds, whatever its setting's type: what the tests take
/// values at and beyond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bounds {
    /// `off` is accepted too.
    Duration {
        min: Duration,
        max: Duration,
        off: bool,
    },
    Count {
        min: u64,
        max: u64,
    },
}

/// A type a setting's value has, and how its default is declared: as a
/// constant of `Const` (the value itself, or a `&'static str` for text;
/// `Infallible` where no default is ever declared).
pub trait Value: Clone + Send + Sync + 'static {
    type Const: Copy + AsText + Send + Sync + 'static;

    fn from_const(value: Self::Const) -> Self;
}

/// A value written the way an operator writes it, for `--help`, the docs
/// and clap, which parses a default back with the setting's own parser.
pub trait AsText {
    fn as_text(&self) -> String;
}

/// A type a range can bound: how its text is read within the range, with
/// the refusals that name the range.
pub trait Bounded: Value<Const = Self> + Copy + PartialOrd {
    /// What `--help` adds after the range.
    const MORE: &'static str = "";

    fn read_within(raw: &str, range: &Range<Self>) -> Result<Self, String>;

    fn bounds(range: &Range<Self>) -> Bounds;
}

impl<T: Value> Setting<T> {
    const fn with(values: Values<T>) -> Self {
        Self {
            variable: "",
            flag: None,
            help: "",
            default: None,
            values,
            hide_default: false,
            hide_value: false,
            hyphen_values: false,
        }
    }

    /// A value `--help` never shows (a URL that may hold a password).
    pub const fn hide_value(self) -> Self {
        Self {
            hide_value: true,
            ..self
        }
    }

    /// A secret: never shown, and it may start with `-`.
    pub const fn secret(self) -> Self {
        Self {
            hyphen_values: true,
            ..self.hide_value()
        }
    }

    /// A default that `--help` does not show (an empty one, meaning unset).
    pub const fn hide_default(self) -> Self {
        Self {
            hide_default: true,
            ..self
        }
    }

    /// A flag without a variable: `--spread`.
    pub const fn flag(self, flag: &'static str) -> Self {
        Self {
            flag: Some(flag),
            ..self
        }
    }

    /// What errors name: the variable, or the flag of a flag without one.
    pub fn name(&self) -> &'static str {
        self.flag.unwrap_or(self.variable)
    }

    /// The variable, if the setting has one.
    pub fn variable(&self) -> Option<&'static str> {
        self.flag.is_none().then_some(self.variable)
    }

    /// The declared default, typed.
    pub fn default_value(&self) -> Option<T> {
        self.default.map(T::from_const)
    }

    /// The default as `--help` shows it (none when unset or hidden).
    pub fn default_text(&self) -> Option<String> {
        self.default
            .filter(|_| !self.hide_default)
            .map(|value| value.as_text())
    }

    /// The range, for a setting that has one.
    pub fn range(&self) -> Option<Range<T::Const>> {
        match self.values {
            Values::Within { range, .. } => Some(range),
            _ => None,
        }
    }

    /// The range as `--help` and the errors write it, for a setting that
    /// has one.
    pub fn range_text(&self) -> Option<String> {
        match &self.values {
            Values::Within { range, .. } => Some(range.text()),
            _ => None,
        }
    }

    /// The one line of `--help`: the help and the range.
    pub fn help_line(&self) -> String {
        match &self.values {
            Values::Within { range, more, .. } => {
                format!("{}; {}{more}", self.help, range.text())
            }
            _ => self.help.to_owned(),
        }
    }

    /// `raw` as this setting reads it, or why it is refused (without the
    /// setting's name).
    pub fn parse(&self, raw: &str) -> Result<T, String> {
        match self.values {
            Values::Parse(parse) => parse(raw),
            Values::Within { range, read, .. } => read(raw, &range),
            Values::Clap(_) | Values::Flag => Err("read by clap itself".to_owned()),
        }
    }

    /// The argument's id and flag: the variable and its name in lower case
    /// with `-`; for a flag without a variable, the flag with `_` and the
    /// flag (as clap's derive names them).
    fn id_and_long(&self) -> (String, String) {
        match self.flag {
            Some(flag) => {
                let long = flag.trim_start_matches('-');
                (long.replace('-', "_"), long.to_owned())
            }
            None => (
                self.variable.to_owned(),
                self.variable.to_lowercase().replace('_', "-"),
            ),
        }
    }

    /// The setting's clap argument.
    pub fn arg(&self) -> Arg {
        let (id, long) = self.id_and_long();
        let mut arg = Arg::new(id.clone())
            .long(long)
            .value_name(id.to_uppercase());
        if !self.help.is_empty() {
            arg = arg.help(self.help_line());
        }
        if self.flag.is_none() {
            arg = arg.env(self.variable);
        }
        if self.hide_value {
            arg = arg.hide_env_values(true);
        }
        if self.hyphen_values {
            arg = arg.allow_hyphen_values(true);
        }
        arg = match self.values {
            Values::Flag => arg
                .action(ArgAction::SetTrue)
                .value_parser(ValueParser::bool()),
            Values::Clap(parser) => arg.action(ArgAction::Set).value_parser(parser()),
            Values::Parse(_) | Values::Within { .. } => {
                let this = *self;
                arg.action(ArgAction::Set)
                    .value_parser(Named::new(move |raw: &str| this.parse(raw)))
            }
        };
        if let Some(default) = self.default {
            arg = arg
                .default_value(default.as_text())
                .hide_default_value(self.hide_default);
        }
        arg
    }

    /// The range's bounds, for a setting that has one.
    pub fn bounds(&self) -> Option<Bounds> {
        match &self.values {
            Values::Within { range, bounds, .. } => Some(bounds(range)),
            _ => None,
        }
    }
}

impl<T: Value> Clone for Setting<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Value> Copy for Setting<T> {}

impl<T: Value> fmt::Debug for Setting<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Setting")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

/// A setting read by `parse`.
pub const fn parsed<T: Value>(parse: fn(&str) -> Result<T, String>) -> Setting<T> {
    Setting::with(Values::Parse(parse))
}

/// A setting from `min` to `max`.
pub const fn within<T: Bounded>(min: T, max: T) -> Setting<T> {
    Setting::with(Values::Within {
        range: Range { min, max },
        read: T::read_within,
        bounds: T::bounds,
        more: T::MORE,
    })
}

/// A setting clap reads with its own parser.
pub const fn by_clap<T: Value>(parser: fn() -> ValueParser) -> Setting<T> {
    Setting::with(Values::Clap(parser))
}

/// A switch without a value, false unless given.
pub const fn switch() -> Setting<bool> {
    Setting::with(Values::Flag)
}

/// A setting, whatever its type, as the lists of every setting hold it:
/// what `--help`, the docs and the tests read.
pub trait Declared {
    fn name(&self) -> &'static str;
    fn variable(&self) -> Option<&'static str>;
    fn default_text(&self) -> Option<String>;
    fn range_text(&self) -> Option<String>;
    fn bounds(&self) -> Option<Bounds>;
    fn arg(&self) -> Arg;
}

impl<T: Value> Declared for Setting<T> {
    fn name(&self) -> &'static str {
        Setting::name(self)
    }
    fn variable(&self) -> Option<&'static str> {
        Setting::variable(self)
    }
    fn default_text(&self) -> Option<String> {
        Setting::default_text(self)
    }
    fn range_text(&self) -> Option<String> {
        Setting::range_text(self)
    }
    fn bounds(&self) -> Option<Bounds> {
        Setting::bounds(self)
    }
    fn arg(&self) -> Arg {
        Setting::arg(self)
    }
}

/// Where a field of a [`group!`] comes from: a setting (the field is its
/// value, or an `Option` of it for a setting without a default), or a
/// group flattened into this one ([`flatten`]).
pub trait Field<F> {
    fn augment(&self, command: Command) -> Command;
    fn take(&self, matches: &mut ArgMatches) -> Result<F, clap::Error>;
    /// The field when nothing is given; `None` for a required setting.
    fn declared(&self) -> Option<F>;
}

fn take_one<T: Value>(
    setting: &Setting<T>,
    matches: &mut ArgMatches,
) -> Result<Option<T>, clap::Error> {
    let (id, _) = setting.id_and_long();
    matches.try_remove_one::<T>(&id).map_err(|error| {
        clap::Error::raw(
            clap::error::ErrorKind::InvalidValue,
            format!("{}: {error}", setting.name()),
        )
    })
}

impl<T: Value> Field<T> for Setting<T> {
    fn augment(&self, command: Command) -> Command {
        command.arg(self.arg())
    }

    fn take(&self, matches: &mut ArgMatches) -> Result<T, clap::Error> {
        match take_one(self, matches)? {
            Some(value) => Ok(value),
            None => self.default_value().ok_or_else(|| {
                clap::Error::raw(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    format!("{}: is required", self.name()),
                )
            }),
        }
    }

    fn declared(&self) -> Option<T> {
        self.default_value()
    }
}

impl<T: Value> Field<Option<T>> for Setting<T> {
    fn augment(&self, command: Command) -> Command {
        command.arg(self.arg())
    }

    fn take(&self, matches: &mut ArgMatches) -> Result<Option<T>, clap::Error> {
        Ok(take_one(self, matches)?.or_else(|| self.default_value()))
    }

    fn declared(&self) -> Option<Option<T>> {
        Some(self.default_value())
    }
}

/// A group of settings flattened into another: `libpq: LibpqArgs = flatten()`.
#[derive(Debug)]
pub struct Flatten<G>(PhantomData<G>);

pub const fn flatten<G>() -> Flatten<G> {
    Flatten(PhantomData)
}

impl<G: clap::Args + clap::FromArgMatches + Default> Field<G> for Flatten<G> {
    fn augment(&self, command: Command) -> Command {
        G::augment_args(command)
    }

    fn take(&self, matches: &mut ArgMatches) -> Result<G, clap::Error> {
        G::from_arg_matches_mut(matches)
    }

    fn declared(&self) -> Option<G> {
        Some(G::default())
    }
}

/// A struct of settings as a clap `Args`: each field `name: Type =
/// SETTING`, its argument added in the order written (the order of
/// `--help`), its value taken from what clap parsed. `struct Name:
/// Default` also gives `Default` (every setting at its declared default).
macro_rules! group {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident: Default {
            $($(#[$fmeta:meta])* $fvis:vis $field:ident: $fty:ty = $source:expr,)*
        }
    ) => {
        $crate::config::setting::group! {
            $(#[$meta])*
            $vis struct $name { $($(#[$fmeta])* $fvis $field: $fty = $source,)* }
        }

        impl ::std::default::Default for $name {
            fn default() -> Self {
                Self {
                    $($field: $crate::config::setting::Field::<$fty>::declared(&$source)
                        .expect("every setting of a Default group has a default"),)*
                }
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $($(#[$fmeta:meta])* $fvis:vis $field:ident: $fty:ty = $source:expr,)*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $($(#[$fmeta])* $fvis $field: $fty,)*
        }

        impl ::clap::FromArgMatches for $name {
            fn from_arg_matches(matches: &::clap::ArgMatches) -> Result<Self, ::clap::Error> {
                Self::from_arg_matches_mut(&mut matches.clone())
            }

            fn from_arg_matches_mut(
                matches: &mut ::clap::ArgMatches,
            ) -> Result<Self, ::clap::Error> {
                Ok(Self {
                    $($field: $crate::config::setting::Field::<$fty>::take(&$source, matches)?,)*
                })
            }

            // Settings always carry a value (given, or their default), so an
            // update is a fresh read.
            fn update_from_arg_matches(
                &mut self,
                matches: &::clap::ArgMatches,
            ) -> Result<(), ::clap::Error> {
                *self = Self::from_arg_matches(matches)?;
                Ok(())
            }
        }

        impl ::clap::Args for $name {
            fn augment_args(command: ::clap::Command) -> ::clap::Command {
                $(let command = $crate::config::setting::Field::<$fty>::augment(&$source, command);)*
                command
            }

            fn augment_args_for_update(command: ::clap::Command) -> ::clap::Command {
                Self::augment_args(command)
            }
        }
    };
}
pub(crate) use group;

/// A clap value parser for a setting: a parse function, with its problem
/// turned into a [`ConfigError`] naming the setting's variable (or its
/// flag, for flags without one); see [`ConfigError::from_clap`].
#[derive(Clone)]
pub struct Named<T>(Arc<Parse<T>>);

/// A parse function, with what it captured (the setting's range, say).
type Parse<T> = dyn Fn(&str) -> Result<T, String> + Send + Sync;

impl<T> Named<T> {
    pub fn new(parse: impl Fn(&str) -> Result<T, String> + Send + Sync + 'static) -> Self {
        Self(Arc::new(parse))
    }
}

/// [`Named`] for a flag that is no setting (`republish --expired-from`).
pub fn named<T: 'static>(parse: fn(&str) -> Result<T, String>) -> Named<T> {
    Named::new(parse)
}

impl<T> fmt::Debug for Named<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Named")
    }
}

impl<T: Clone + Send + Sync + 'static> TypedValueParser for Named<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let (parse, name) = (Arc::clone(&self.0), setting_name(arg));
        // clap keeps the closure's error as the source of its own error.
        let named =
            move |raw: &str| parse(raw).map_err(|problem| ConfigError::new(name.clone(), problem));
        named.parse_ref(cmd, arg, value)
    }
}

/// A setting's id is its variable name; a flag without a variable is named
/// by its flag.
fn setting_name(arg: Option<&Arg>) -> String {
    let Some(arg) = arg else {
        return "a setting".to_owned();
    };
    let id = arg.get_id().as_str();
    let is_variable = id
        .chars()
        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    match arg.get_long() {
        Some(long) if !is_variable => format!("--{long}"),
        _ => id.to_owned(),
    }
}

// --- the value types ---------------------------------------------------------

/// Types whose default is declared as the value itself.
macro_rules! declared_as_themselves {
    ($($ty:ty),*) => {
        $(impl Value for $ty {
            type Const = Self;

            fn from_const(value: Self) -> Self {
                value
            }
        })*
    };
}
declared_as_themselves!(
    Duration,
    Option<Duration>,
    Option<SaslMechanism>,
    Option<SecurityProtocol>,
    Option<SslMode>
);

/// Types whose default is declared as the value itself and written as
/// they display.
macro_rules! declared_as_themselves_and_displayed {
    ($($ty:ty),*) => {
        declared_as_themselves!($($ty),*);
        $(impl AsText for $ty {
            fn as_text(&self) -> String {
                self.to_string()
            }
        })*
    };
}
declared_as_themselves_and_displayed!(
    u32,
    u64,
    i32,
    i16,
    f64,
    bool,
    SocketAddr,
    Pooler,
    Compression
);

impl Value for String {
    type Const = &'static str;

    fn from_const(value: &'static str) -> Self {
        value.to_owned()
    }
}

/// Types of settings that have no default.
macro_rules! never_declared {
    ($($ty:ty),*) => {
        $(impl Value for $ty {
            type Const = Infallible;

            fn from_const(value: Infallible) -> Self {
                match value {}
            }
        })*
    };
}
never_declared!(PgUrl, PathBuf, Secret, BootstrapServers);

const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

impl AsText for Duration {
    /// `500ms`, `30s`, `60s`, `5m`, `24h`, `12d`: the forms the operator
    /// documentation uses (one minute stays `60s` and one day `24h`, as
    /// documented).
    fn as_text(&self) -> String {
        let secs = self.as_secs();
        if self.subsec_nanos() != 0 {
            if self.subsec_nanos().is_multiple_of(1_000_000) {
                format!("{}ms", self.as_millis())
            } else {
                humantime::format_duration(*self).to_string()
            }
        } else if secs > DAY && secs.is_multiple_of(DAY) {
            format!("{}d", secs / DAY)
        } else if secs > 0 && secs.is_multiple_of(HOUR) {
            format!("{}h", secs / HOUR)
        } else if secs > MINUTE && secs.is_multiple_of(MINUTE) {
            format!("{}m", secs / MINUTE)
        } else {
            format!("{secs}s")
        }
    }
}

/// A skew limit: `off` when there is none.
impl AsText for Option<Duration> {
    fn as_text(&self) -> String {
        self.as_ref()
            .map_or_else(|| "off".to_owned(), AsText::as_text)
    }
}

impl AsText for &'static str {
    fn as_text(&self) -> String {
        (*self).to_owned()
    }
}

/// An unset value declared as an empty default (so an empty variable is
/// unset too): empty.
macro_rules! as_text_empty_when_unset {
    ($($ty:ty),*) => {
        $(impl AsText for Option<$ty> {
            fn as_text(&self) -> String {
                self.map(|value| format!("{value:?}")).unwrap_or_default()
            }
        })*
    };
}
as_text_empty_when_unset!(SaslMechanism, SecurityProtocol, SslMode);

impl AsText for Infallible {
    fn as_text(&self) -> String {
        match *self {}
    }
}

/// A humantime duration (`500ms`, `1s`, `60s`, `2m`).
fn duration(raw: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(raw.trim())
}

impl Bounded for Duration {
    fn read_within(raw: &str, range: &Range<Self>) -> Result<Self, String> {
        let value = duration(raw).map_err(|_| {
            format!(
                "must be a duration from {} (like 500ms, 1s or 60s), got {raw:?}",
                range.text()
            )
        })?;
        check(range, value)
    }

    fn bounds(range: &Range<Self>) -> Bounds {
        Bounds::Duration {
            min: range.min,
            max: range.max,
            off: false,
        }
    }
}

/// A duration in the range, or `off` for none.
impl Bounded for Option<Duration> {
    const MORE: &'static str = ", or off";

    fn read_within(raw: &str, range: &Range<Self>) -> Result<Self, String> {
        if raw.trim() == "off" {
            return Ok(None);
        }
        let value = duration(raw).map_err(|_| {
            format!(
                "must be off or a duration from {} (like 500ms, 1s or 60s), got {raw:?}",
                range.text()
            )
        })?;
        check(range, Some(value)).map_err(|problem| format!("{problem} (or off)"))
    }

    fn bounds(range: &Range<Self>) -> Bounds {
        Bounds::Duration {
            min: range.min.unwrap_or_default(),
            max: range.max.unwrap_or_default(),
            off: true,
        }
    }
}

/// `value`, or why it is refused (the range, and the value).
fn check<T: AsText + PartialOrd>(range: &Range<T>, value: T) -> Result<T, String> {
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(format!(
            "must be from {}, got {}",
            range.text(),
            value.as_text()
        ))
    }
}

/// Whole numbers: read wide, so that a value past the type's own bounds
/// is refused with the range like any other.
macro_rules! counts {
    ($($ty:ty),*) => {
        $(impl Bounded for $ty {
            fn read_within(raw: &str, range: &Range<Self>) -> Result<Self, String> {
                let value: i128 = raw.trim().parse().map_err(|_| {
                    format!("must be a whole number from {}, got {raw:?}", range.text())
                })?;
                if value < i128::from(range.min) || value > i128::from(range.max) {
                    return Err(format!("must be from {}, got {value}", range.text()));
                }
                <$ty>::try_from(value)
                    .map_err(|_| format!("must be from {}, got {value}", range.text()))
            }

            fn bounds(range: &Range<Self>) -> Bounds {
                // Every count's range starts at 0 or above (the tests check it).
                Bounds::Count {
                    min: u64::try_from(range.min).unwrap_or(0),
                    max: u64::try_from(range.max).unwrap_or(0),
                }
            }
        })*
    };
}
counts!(u32, u64, i32, i16);
