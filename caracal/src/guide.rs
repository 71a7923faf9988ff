//! The reference, one page per topic: reference pages, no items. Each page is a Markdown file
//! in `caracal/docs/`, which GitHub shows as it is.

/// Declares the pages. A page links to another by its file name (`[…][leases.md]`) and to an
/// item by its path (``[`caracal::Error`]``), and ends with the definitions GitHub follows (the
/// files); the definitions here come first, and the first definition of a label is the one
/// Markdown uses, so rustdoc follows these to the modules and items instead.
macro_rules! pages {
    ($($page:ident => $file:literal,)*) => {$(
        #[doc = "[attributes.md]: crate::guide::attributes"]
        #[doc = "[stacking.md]: crate::guide::stacking"]
        #[doc = "[leases.md]: crate::guide::leases"]
        #[doc = "[failures.md]: crate::guide::failures"]
        #[doc = "[events.md]: crate::guide::events"]
        #[doc = "[errors.md]: crate::guide::errors"]
        #[doc = "[operations.md]: crate::guide::operations"]
        #[doc = "[configuration.md]: crate::guide::configuration"]
        #[doc = "[tower.md]: crate::guide::tower"]
        #[doc = "[newcomer.md]: crate::guide::newcomer"]
        #[doc = "[`caracal::admin`]: crate::admin"]
        #[doc = "[`caracal::metrics`]: crate::metrics"]
        #[doc = "[`caracal::Config`]: crate::Config"]
        #[doc = "[`caracal::Error`]: crate::Error"]
        #[doc = "[`CoordinatorFailure`]: crate::CoordinatorFailure"]
        #[doc = "[`caracal::fencing_token()`]: crate::fencing_token"]
        #[doc = "[`caracal::Priority`]: crate::Priority"]
        #[doc = "[`caracal::with_priority`]: crate::with_priority"]
        #[doc = "[`caracal::REDIS_ACL_RULES`]: crate::REDIS_ACL_RULES"]
        #[doc = include_str!(concat!("../docs/", $file))]
        pub mod $page {}
    )*};
}

pages! {
    newcomer => "newcomer.md",
    attributes => "attributes.md",
    stacking => "stacking.md",
    leases => "leases.md",
    failures => "failures.md",
    events => "events.md",
    errors => "errors.md",
    operations => "operations.md",
    configuration => "configuration.md",
    tower => "tower.md",
}
