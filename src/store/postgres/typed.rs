//! Statements sent in one flight: a statement's parameters with their types
//! ([`typed!`]), for `query_typed` and `execute_typed`.
//!
//! `client.query(sql, params)` with SQL text costs two round trips: the server parses the
//! statement and says its parameters' types, then it is bound and run. With the types given
//! (`query_typed`), parse, bind and run go in one flight: one round trip, which is what a
//! worker 10 ms from its database waits on. Each type is the one the parameter's Rust type
//! writes ([`SqlType`]), so a statement's `$n` take the type their values have; a statement
//! that wants another (a `uuid` from text) casts it in SQL, as every statement here does.

use tokio_postgres::types::{ToSql, Type};

/// The PostgreSQL type a Rust value is written as.
pub(crate) trait SqlType {
    const TYPE: Type;
}

macro_rules! sql_types {
    ($($rust:ty => $pg:ident),* $(,)?) => {
        $(impl SqlType for $rust {
            const TYPE: Type = Type::$pg;
        })*
    };
}

sql_types! {
    bool => BOOL,
    i32 => INT4,
    i64 => INT8,
    f64 => FLOAT8,
    String => TEXT,
    str => TEXT,
    serde_json::Value => JSONB,
    Vec<i64> => INT8_ARRAY,
    [i64] => INT8_ARRAY,
    Vec<i32> => INT4_ARRAY,
    Vec<String> => TEXT_ARRAY,
    Vec<&str> => TEXT_ARRAY,
    [&str] => TEXT_ARRAY,
    Vec<Option<String>> => TEXT_ARRAY,
    Vec<Option<&str>> => TEXT_ARRAY,
}

impl<T: SqlType> SqlType for Option<T> {
    const TYPE: Type = T::TYPE;
}

impl<T: SqlType + ?Sized> SqlType for &T {
    const TYPE: Type = T::TYPE;
}

/// `value` with the type it is written as.
pub(crate) fn param<T: ToSql + SqlType + Sync>(value: &T) -> (&(dyn ToSql + Sync), Type) {
    (value, T::TYPE)
}

/// `[(&value, type), ...]` for `query_typed`: `typed![job.0, me.0, log_number(log)]`.
macro_rules! typed {
    ($($value:expr),* $(,)?) => {
        [$($crate::store::postgres::typed::param(&$value)),*]
    };
}

pub(crate) use typed;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_takes_the_type_it_writes() {
        let ids = vec!["a".to_string()];
        let none: Option<i64> = None;
        let params = typed![1i64, "x", ids, none, 2i32];
        let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
        assert_eq!(
            types,
            [
                Type::INT8,
                Type::TEXT,
                Type::TEXT_ARRAY,
                Type::INT8,
                Type::INT4
            ]
        );
        // And the value can be written as it: what `query_typed` checks before it sends.
        for (value, ty) in &params {
            let mut buf = tokio_postgres::types::private::BytesMut::new();
            assert!(value.to_sql_checked(ty, &mut buf).is_ok(), "{ty}");
        }
    }
}
