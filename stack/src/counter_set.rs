//! [`counter_set!`](crate::counter_set): one declaration for every set of event counters in
//! ferroce (a QP's, a port's, a switch hook's), so each set reports and adds up the same way.

/// Declares a struct of `u64` event counters with `iter` (every counter with the name reports
/// give it: the field's name unless `=> "name"` follows it, as where Linux's rdma hw counter
/// name differs) and `accumulate` (adds another set in, e.g. the engines of one device or
/// several switches into one report). With `atomic Shared` it also declares `Shared`, the same
/// counters as relaxed atomics with `snapshot`, for counters a hook updates from a thread that
/// does not own the report.
///
/// ```
/// ferroce_stack::counter_set! {
///     /// What a hook saw.
///     pub struct HookStats, atomic SharedHookStats {
///         /// Frames seen.
///         frames,
///         /// Frames dropped, under the name a report wants.
///         dropped => "frames_dropped",
///     }
/// }
/// let mut a = HookStats { frames: 2, dropped: 1 };
/// a.accumulate(&HookStats { frames: 3, dropped: 0 });
/// assert_eq!(a.iter().collect::<Vec<_>>(), [("frames", 5), ("frames_dropped", 1)]);
/// assert_eq!(SharedHookStats::default().snapshot(), HookStats::default());
/// ```
#[macro_export]
macro_rules! counter_set {
    (
        $(#[$sm:meta])* $vis:vis struct $name:ident {
            $( $(#[$m:meta])* $field:ident $(=> $label:literal)?, )+
        }
    ) => {
        $(#[$sm])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        $vis struct $name {
            $( $(#[$m])* pub $field: u64, )+
        }

        impl $name {
            /// Every counter with its name, for reports.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$(($crate::counter_set!(@label $field $($label)?), self.$field)),+].into_iter()
            }

            /// Adds `o`'s counts into these.
            pub fn accumulate(&mut self, o: &Self) {
                $( self.$field += o.$field; )+
            }
        }
    };
    (
        $(#[$sm:meta])* $vis:vis struct $name:ident, atomic $shared:ident {
            $( $(#[$m:meta])* $field:ident $(=> $label:literal)?, )+
        }
    ) => {
        $crate::counter_set! {
            $(#[$sm])* $vis struct $name { $( $(#[$m])* $field $(=> $label)?, )+ }
        }

        #[doc = concat!("The counters of [`", stringify!($name), "`] as relaxed atomics, \
            so counting costs no lock per event.")]
        #[derive(Debug, Default)]
        $vis struct $shared {
            $( $field: ::core::sync::atomic::AtomicU64, )+
        }

        impl $shared {
            /// The counters now.
            pub fn snapshot(&self) -> $name {
                $name {
                    $( $field: self.$field.load(::core::sync::atomic::Ordering::Relaxed), )+
                }
            }
        }
    };
    (@label $field:ident) => { stringify!($field) };
    (@label $field:ident $label:literal) => { $label };
}
