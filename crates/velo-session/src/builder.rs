//! The setters every configuration builder of the stack repeats.

/// Setters of a builder that wraps the value it builds (`pub struct FooBuilder(Foo)`): each
/// `name: Type;` line, with its doc comment, becomes `pub fn name(mut self, value: Type) ->
/// Self`, which stores `value` in the field of that name. What a value may be is checked by
/// the builder's own `build`, never here.
#[macro_export]
macro_rules! builder_setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: $ty) -> Self {
                self.0.$name = value;
                self
            }
        )*
    };
}
