//! `wire_enum!`: unit enums carried as strings. (The `rmpv` value
//! deserializer does not map strings to unit variants, so these enums
//! implement serde by hand through their wire names.)

/// Define a unit enum whose wire form is a string, with an optional
/// catch-all variant for names this version does not know.
#[macro_export]
#[doc(hidden)]
macro_rules! wire_enum {
    (
        $(#[$m:meta])*
        pub enum $name:ident { $($(#[$vm:meta])* $variant:ident = $wire:literal,)* }
        $(other = $other:ident;)?
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vm])* $variant,)*
            $(
                /// A name this version does not know.
                $other,
            )?
        }

        impl $name {
            /// Every known variant.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The wire name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire,)*
                    $($name::$other => "unknown",)?
                }
            }

            /// Parse a wire name.
            #[allow(clippy::should_implement_trait)]
            pub fn from_str(s: &str) -> Option<Self> {
                match s {
                    $($wire => Some($name::$variant),)*
                    _ => None $(.or(Some($name::$other)))?,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str(concat!("one of: ", $($wire, " ",)*))
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$name, E> {
                        $name::from_str(v).ok_or_else(|| {
                            E::custom(format!("unknown value {v:?}, expected {}", concat!($($wire, " ",)*).trim_end()))
                        })
                    }
                }
                d.deserialize_str(V)
            }
        }
    };
}
