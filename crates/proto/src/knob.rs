//! Tunables by name: a table per configuration struct of what each knob
//! means, its unit and range, and how to read and write it.
//!
//! Drivers that read settings from text (the simulator's scenario files,
//! tools' command lines) set knobs through these tables instead of one
//! hand-written match per driver, so a knob added to the core is settable
//! everywhere at once, with the same validation and the same documentation.

/// One tunable of a `T`.
pub struct Knob<T> {
    /// Its name (the field name, with its unit).
    pub name: &'static str,
    /// What it sets, one line.
    pub doc: &'static str,
    /// Smallest accepted value.
    pub min: f64,
    /// Largest accepted value.
    pub max: f64,
    /// Whether only whole numbers are accepted.
    pub integer: bool,
    /// Its current value in `T`.
    pub get: fn(&T) -> f64,
    /// Write a value already checked against the range.
    pub set: fn(&mut T, f64),
}

impl<T> std::fmt::Debug for Knob<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Knob").field("name", &self.name).finish()
    }
}

/// A knob value out of range, or not a whole number where one is needed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KnobError {
    /// The value is outside the knob's range.
    #[error("must be in {min}..={max}, not {value}")]
    OutOfRange {
        /// The value given.
        value: f64,
        /// Smallest accepted.
        min: f64,
        /// Largest accepted.
        max: f64,
    },
    /// The knob takes whole numbers.
    #[error("must be a whole number, not {0}")]
    NotInteger(f64),
}

impl<T> Knob<T> {
    /// Check `value` against the range and write it.
    pub fn apply(&self, target: &mut T, value: f64) -> Result<(), KnobError> {
        if self.integer && value.fract() != 0.0 {
            return Err(KnobError::NotInteger(value));
        }
        if !(self.min..=self.max).contains(&value) {
            return Err(KnobError::OutOfRange {
                value,
                min: self.min,
                max: self.max,
            });
        }
        (self.set)(target, value);
        Ok(())
    }
}

/// The knob called `name` in `table`.
pub fn find<'a, T>(table: &'a [Knob<T>], name: &str) -> Option<&'a Knob<T>> {
    table.iter().find(|k| k.name == name)
}

/// A whole-number knob over an integer field, `$field` of type `$ty`.
#[macro_export]
#[doc(hidden)]
macro_rules! int_knob {
    ($t:ty, $field:ident : $ty:ty, $min:expr, $max:expr, $doc:expr) => {
        $crate::knob::Knob::<$t> {
            name: stringify!($field),
            doc: $doc,
            min: $min as f64,
            max: $max as f64,
            integer: true,
            get: |c| c.$field as f64,
            set: |c, v| c.$field = v as $ty,
        }
    };
}

/// A real-valued knob over an `f64` field.
#[macro_export]
#[doc(hidden)]
macro_rules! real_knob {
    ($t:ty, $field:ident, $min:expr, $max:expr, $doc:expr) => {
        $crate::knob::Knob::<$t> {
            name: stringify!($field),
            doc: $doc,
            min: $min,
            max: $max,
            integer: false,
            get: |c| c.$field,
            set: |c, v| c.$field = v,
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Conf {
        packets: u32,
        gain: f64,
    }

    fn table() -> [Knob<Conf>; 2] {
        [
            int_knob!(Conf, packets: u32, 1, 64, "packets"),
            real_knob!(Conf, gain, 0.0, 1.0, "gain"),
        ]
    }

    #[test]
    fn applies_in_range_and_refuses_the_rest() {
        let t = table();
        let mut c = Conf::default();
        find(&t, "packets").unwrap().apply(&mut c, 8.0).unwrap();
        find(&t, "gain").unwrap().apply(&mut c, 0.25).unwrap();
        assert_eq!((c.packets, c.gain), (8, 0.25));
        assert_eq!((find(&t, "packets").unwrap().get)(&c), 8.0);
        assert_eq!(
            find(&t, "packets").unwrap().apply(&mut c, 65.0),
            Err(KnobError::OutOfRange {
                value: 65.0,
                min: 1.0,
                max: 64.0
            })
        );
        assert_eq!(
            find(&t, "packets").unwrap().apply(&mut c, 1.5),
            Err(KnobError::NotInteger(1.5))
        );
        assert!(find(&t, "gain").unwrap().apply(&mut c, f64::NAN).is_err());
        assert!(find(&t, "nope").is_none());
        assert_eq!(c.packets, 8, "a refused value changes nothing");
    }
}
