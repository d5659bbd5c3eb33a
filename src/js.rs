//! serde over JavaScript values, for the browser shell: the configuration, page
//! messages, stored records and JSON answers read into core types, and core types
//! written back as plain objects.
//!
//! Not serde-wasm-bindgen: its errors describe a mistyped number with core's float
//! formatting, which with the crate cost about 12 KB of the gzipped module; here the
//! browser formats that number. The conversions are the ones the shell relied on:
//! `null` and `undefined` are unit and `None`, a struct reads only its own fields
//! (others are ignored), integers up to 2^53 are integers, `None` is written `null`,
//! structs and maps are written as plain objects.

use js_sys::{Array, Object, Reflect};
use serde::de::{self, IntoDeserializer, Unexpected};
use serde::ser::{self, Serialize};
use std::fmt;
use wasm_bindgen::{JsCast, JsValue};

const MAX_SAFE: f64 = crate::core::record::MAX_SAFE_INTEGER as f64;

/// Deeper values are refused rather than risk the module's stack (a JSON answer or a
/// page message nested this deep is not one the outbox reads).
const MAX_DEPTH: u16 = 128;

thread_local! {
    /// The JavaScript strings of field names made so far, with each name's address and
    /// length (names are `&'static str`: the address is the name's identity). A list:
    /// the module holds a few dozen names, and a map's code cost 0.5 KB of gzip more.
    static NAMES: std::cell::RefCell<Vec<(usize, usize, JsValue)>> = const {
        std::cell::RefCell::new(Vec::new())
    };
}

/// Calls `f` with `name` as a JavaScript string, made once per worker: a field name
/// crossing into JavaScript is a UTF-8 decode each time, and a write or a replayed
/// record sets or reads some twenty of them (the record, its report). `f` must not
/// call `with_name` itself.
pub fn with_name<R>(name: &'static str, f: impl FnOnce(&JsValue) -> R) -> R {
    let id = (name.as_ptr() as usize, name.len());
    NAMES.with(|names| {
        let mut names = names.borrow_mut();
        let at = match names.iter().position(|(p, l, _)| (*p, *l) == id) {
            Some(at) => at,
            None => {
                names.push((id.0, id.1, JsValue::from_str(name)));
                names.len() - 1
            }
        };
        f(&names[at].2)
    })
}

/// Why a value could not be read or written.
#[derive(Debug)]
pub struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error(msg.to_string())
    }

    fn invalid_type(unexp: Unexpected, exp: &dyn de::Expected) -> Self {
        Error(format!(
            "invalid type: {}, expected {exp}",
            unexpected(unexp)
        ))
    }

    fn invalid_value(unexp: Unexpected, exp: &dyn de::Expected) -> Self {
        Error(format!(
            "invalid value: {}, expected {exp}",
            unexpected(unexp)
        ))
    }
}

impl ser::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

/// serde's own description of an unexpected value, except that a float is formatted
/// by the browser (serde's `Display` pulls in core's float formatting).
fn unexpected(u: Unexpected) -> String {
    match u {
        Unexpected::Bool(b) => format!("boolean `{b}`"),
        Unexpected::Unsigned(n) => format!("integer `{n}`"),
        Unexpected::Signed(n) => format!("integer `{n}`"),
        Unexpected::Float(n) => format!(
            "floating point `{}`",
            js_sys::Number::from(n)
                .to_string_with_radix(10)
                .map(String::from)
                .unwrap_or_default()
        ),
        Unexpected::Char(c) => format!("character `{c}`"),
        Unexpected::Str(s) => format!("string {}", crate::core::text::quoted(s)),
        Unexpected::Bytes(_) => "byte array".into(),
        Unexpected::Unit => "unit value".into(),
        Unexpected::Option => "Option value".into(),
        Unexpected::NewtypeStruct => "newtype struct".into(),
        Unexpected::Seq => "sequence".into(),
        Unexpected::Map => "map".into(),
        Unexpected::Enum => "enum".into(),
        Unexpected::UnitVariant => "unit variant".into(),
        Unexpected::NewtypeVariant => "newtype variant".into(),
        Unexpected::TupleVariant => "tuple variant".into(),
        Unexpected::StructVariant => "struct variant".into(),
        Unexpected::Other(o) => o.into(),
    }
}

/// Reads a JavaScript value as `T`.
pub fn from_value<T: de::DeserializeOwned>(value: JsValue) -> Result<T, Error> {
    T::deserialize(De::new(value))
}

/// A JavaScript value (a parsed JSON answer) as a JSON value, read as
/// `from_value::<serde_json::Value>` reads it, without serde's visitors in the module:
/// `null` and `undefined` are null, integers up to 2^53 are integers, other numbers are
/// floats (NaN and the infinities null), a BigInt is the number `Number()` gives, arrays
/// and plain objects (or a `Map` with string keys) are read to [`MAX_DEPTH`]; `None` for
/// anything else (a function, a symbol, an `ArrayBuffer`, an iterable that is not an
/// array, a non-string key) or for deeper values.
pub fn json_value(value: &JsValue) -> Option<serde_json::Value> {
    json_at(value, 0)
}

fn json_at(v: &JsValue, depth: u16) -> Option<serde_json::Value> {
    use serde_json::Value;
    if depth > MAX_DEPTH {
        return None;
    }
    if v.is_null() || v.is_undefined() {
        return Some(Value::Null);
    }
    if let Some(b) = v.as_bool() {
        return Some(Value::Bool(b));
    }
    if let Some(n) = v.as_f64() {
        return Some(if n.fract() == 0.0 && n.abs() <= MAX_SAFE {
            Value::from(n as i64)
        } else {
            serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number)
        });
    }
    if let Some(s) = v.as_string() {
        return Some(Value::String(s));
    }
    if v.is_bigint() {
        #[allow(deprecated)]
        let n = js_sys::Number::new(v).value_of();
        return json_at(&JsValue::from_f64(n), depth + 1);
    }
    if Array::is_array(v) {
        let items: &Array = v.unchecked_ref();
        let mut out = Vec::with_capacity(items.length() as usize);
        for i in 0..items.length() {
            out.push(json_at(&items.get(i), depth + 1)?);
        }
        return Some(Value::Array(out));
    }
    if !v.is_object() {
        return None;
    }
    let pairs = entries_of(v)?;
    let mut map = serde_json::Map::new();
    for i in 0..pairs.length() {
        let pair: Array = pairs.get(i).unchecked_into();
        let key = pair.get(0).as_string()?;
        map.insert(key, json_at(&pair.get(1), depth + 1)?);
    }
    Some(Value::Object(map))
}

/// A plain object's (or a `Map`'s) entries as `[key, value]` pairs; `None` for other
/// iterables and for byte buffers, which no reader here takes as a map.
fn entries_of(v: &JsValue) -> Option<Array> {
    if let Some(map) = v.dyn_ref::<js_sys::Map>() {
        return Some(Array::from(&map.entries()));
    }
    let iterable = Reflect::has(v, &js_sys::Symbol::iterator()).unwrap_or(true);
    if iterable || v.is_instance_of::<js_sys::ArrayBuffer>() {
        return None;
    }
    Some(Object::entries(v.unchecked_ref()))
}

/// Reads a JavaScript value as `T`, offering a struct every own key of its object, so a
/// struct that denies unknown fields refuses them (the configuration does: a misspelt
/// field must not be silently ignored).
pub fn from_value_strict<T: de::DeserializeOwned>(value: JsValue) -> Result<T, Error> {
    T::deserialize(De {
        value,
        depth: 0,
        strict: true,
    })
}

/// Writes `v` as a JavaScript value.
pub fn to_value<T: Serialize + ?Sized>(v: &T) -> Result<JsValue, Error> {
    v.serialize(Ser)
}

/// A JavaScript value being read.
pub struct De {
    value: JsValue,
    depth: u16,
    /// Structs see every own key, not only their declared fields.
    strict: bool,
}

impl De {
    pub fn new(value: JsValue) -> De {
        De {
            value,
            depth: 0,
            strict: false,
        }
    }

    fn child(&self, value: JsValue) -> De {
        De {
            value,
            depth: self.depth + 1,
            strict: self.strict,
        }
    }

    fn nullish(&self) -> bool {
        self.value.is_null() || self.value.is_undefined()
    }

    fn invalid<T>(&self, exp: &dyn de::Expected) -> Result<T, Error> {
        let text;
        let u = if self.nullish() {
            Unexpected::Unit
        } else if let Some(b) = self.value.as_bool() {
            Unexpected::Bool(b)
        } else if let Some(n) = self.value.as_f64() {
            Unexpected::Float(n)
        } else if let Some(s) = self.value.as_string() {
            text = s;
            Unexpected::Str(&text)
        } else if Array::is_array(&self.value) {
            Unexpected::Seq
        } else {
            Unexpected::Other("an object")
        };
        Err(de::Error::invalid_type(u, exp))
    }

    fn entries(&self) -> Option<Array> {
        entries_of(&self.value)
    }
}

impl<'de> IntoDeserializer<'de, Error> for De {
    type Deserializer = De;
    fn into_deserializer(self) -> De {
        self
    }
}

impl<'de> de::Deserializer<'de> for De {
    type Error = Error;

    fn deserialize_any<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.depth > MAX_DEPTH {
            return Err(Error("the value is nested too deeply".into()));
        }
        if self.nullish() {
            return visitor.visit_unit();
        }
        if let Some(b) = self.value.as_bool() {
            return visitor.visit_bool(b);
        }
        if let Some(n) = self.value.as_f64() {
            return if n.fract() == 0.0 && n.abs() <= MAX_SAFE {
                visitor.visit_i64(n as i64)
            } else {
                visitor.visit_f64(n)
            };
        }
        if let Some(s) = self.value.as_string() {
            return visitor.visit_string(s);
        }
        if self.value.is_bigint() {
            // Read as the number `Number(value)` gives (exact up to 2^53, which holds
            // every integer the outbox reads).
            #[allow(deprecated)]
            let n = js_sys::Number::new(&self.value).value_of();
            return self.child(JsValue::from_f64(n)).deserialize_any(visitor);
        }
        if Array::is_array(&self.value) {
            return visitor.visit_seq(Items {
                items: self.value.clone().unchecked_into(),
                next: 0,
                parent: &self,
            });
        }
        if self.value.is_object() {
            if let Some(pairs) = self.entries() {
                return visitor.visit_map(Pairs {
                    pairs,
                    next: 0,
                    value: JsValue::UNDEFINED,
                    parent: &self,
                });
            }
        }
        self.invalid(&visitor)
    }

    fn deserialize_option<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.nullish() {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_newtype_struct<V: de::Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    /// Only the struct's own fields are read (every own key when strict); a field that
    /// is absent (not merely `undefined`) is left to serde's defaults.
    fn deserialize_struct<V: de::Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        if !self.value.is_object() {
            return self.invalid(&visitor);
        }
        if self.strict {
            if let Some(pairs) = self.entries() {
                return visitor.visit_map(Pairs {
                    pairs,
                    next: 0,
                    value: JsValue::UNDEFINED,
                    parent: &self,
                });
            }
        }
        visitor.visit_map(Fields {
            fields: fields.iter(),
            value: JsValue::UNDEFINED,
            parent: &self,
        })
    }

    fn deserialize_ignored_any<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    /// A string names a unit variant (`"rate-limited"`): the stored delivery state's
    /// stop reason. No other enum shape is read.
    fn deserialize_enum<V: de::Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.value.as_string() {
            Some(s) => visitor.visit_enum(de::IntoDeserializer::<Error>::into_deserializer(s)),
            None => self.invalid(&visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf unit unit_struct seq tuple tuple_struct map identifier
    }
}

/// An array's elements.
struct Items<'a> {
    items: Array,
    next: u32,
    parent: &'a De,
}

impl<'de> de::SeqAccess<'de> for Items<'_> {
    type Error = Error;

    fn next_element_seed<T: de::DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        if self.next >= self.items.length() {
            return Ok(None);
        }
        let item = self.items.get(self.next);
        self.next += 1;
        seed.deserialize(self.parent.child(item)).map(Some)
    }
}

/// `[key, value]` pairs of an object or a `Map`.
struct Pairs<'a> {
    pairs: Array,
    next: u32,
    value: JsValue,
    parent: &'a De,
}

impl<'de> de::MapAccess<'de> for Pairs<'_> {
    type Error = Error;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        if self.next >= self.pairs.length() {
            return Ok(None);
        }
        let pair: Array = self.pairs.get(self.next).unchecked_into();
        self.next += 1;
        self.value = pair.get(1);
        seed.deserialize(self.parent.child(pair.get(0))).map(Some)
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let value = std::mem::replace(&mut self.value, JsValue::UNDEFINED);
        seed.deserialize(self.parent.child(value))
    }
}

/// The named fields of a struct, as a map without the others.
struct Fields<'a> {
    fields: std::slice::Iter<'static, &'static str>,
    value: JsValue,
    parent: &'a De,
}

impl<'de> de::MapAccess<'de> for Fields<'_> {
    type Error = Error;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let obj = &self.parent.value;
        for field in self.fields.by_ref() {
            let key = JsValue::from_str(field);
            let value = Reflect::get(obj, &key).unwrap_or(JsValue::UNDEFINED);
            if value.is_undefined() && !Reflect::has(obj, &key).unwrap_or(false) {
                continue;
            }
            self.value = value;
            return seed
                .deserialize(IntoDeserializer::<Error>::into_deserializer(*field))
                .map(Some);
        }
        Ok(None)
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let value = std::mem::replace(&mut self.value, JsValue::UNDEFINED);
        seed.deserialize(self.parent.child(value))
    }
}

/// Writes Rust values as JavaScript values.
pub struct Ser;

/// An array being written.
pub struct SeqOut(Array);

/// An object being written (a struct, or a map with string keys).
pub struct ObjOut {
    obj: Object,
    key: JsValue,
}

impl ObjOut {
    fn set(&self, key: &JsValue, value: JsValue) -> Result<(), Error> {
        Reflect::set(&self.obj, key, &value)
            .map(drop)
            .map_err(|_| Error("a field could not be set".into()))
    }
}

fn number(n: f64) -> Result<JsValue, Error> {
    if n.abs() <= MAX_SAFE {
        Ok(JsValue::from_f64(n))
    } else {
        Err(Error(
            "an integer beyond 2^53 has no exact JavaScript number".into(),
        ))
    }
}

fn unsupported(what: &str) -> Error {
    Error(format!("{what} cannot be written as a JavaScript value"))
}

impl ser::Serializer for Ser {
    type Ok = JsValue;
    type Error = Error;
    type SerializeSeq = SeqOut;
    type SerializeTuple = SeqOut;
    type SerializeTupleStruct = SeqOut;
    type SerializeTupleVariant = ser::Impossible<JsValue, Error>;
    type SerializeMap = ObjOut;
    type SerializeStruct = ObjOut;
    type SerializeStructVariant = ser::Impossible<JsValue, Error>;

    fn serialize_bool(self, v: bool) -> Result<JsValue, Error> {
        Ok(JsValue::from_bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<JsValue, Error> {
        Ok(JsValue::from_f64(v.into()))
    }
    fn serialize_i16(self, v: i16) -> Result<JsValue, Error> {
        Ok(JsValue::from_f64(v.into()))
    }
    fn serialize_i32(self, v: i32) -> Result<JsValue, Error> {
        Ok(JsValue::from_f64(v.into()))
    }
    fn serialize_i64(self, v: i64) -> Result<JsValue, Error> {
        number(v as f64)
    }
    fn serialize_u8(self, v: u8) -> Result<JsValue, Error> {
        Ok(JsValue::from_f64(v.into()))
    }
    fn serialize_u16(self, v: u16) -> Result<JsValue, Error> {
        Ok(JsValue::from_f64(v.into()))
    }
    fn serialize_u32(self, v: u32) -> Result<JsValue, Error> {
        Ok(JsValue::from_f64(v.into()))
    }
    fn serialize_u64(self, v: u64) -> Result<JsValue, Error> {
        number(v as f64)
    }
    fn serialize_f32(self, v: f32) -> Result<JsValue, Error> {
        Ok(JsValue::from_f64(v.into()))
    }
    fn serialize_f64(self, v: f64) -> Result<JsValue, Error> {
        Ok(JsValue::from_f64(v))
    }
    fn serialize_char(self, v: char) -> Result<JsValue, Error> {
        Ok(JsValue::from_str(v.encode_utf8(&mut [0; 4])))
    }
    fn serialize_str(self, v: &str) -> Result<JsValue, Error> {
        Ok(JsValue::from_str(v))
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<JsValue, Error> {
        Err(unsupported("bytes"))
    }
    fn serialize_none(self) -> Result<JsValue, Error> {
        Ok(JsValue::NULL)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<JsValue, Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<JsValue, Error> {
        Ok(JsValue::NULL)
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<JsValue, Error> {
        Ok(JsValue::NULL)
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<JsValue, Error> {
        Ok(JsValue::from_str(variant))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<JsValue, Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<JsValue, Error> {
        Err(unsupported("a newtype variant"))
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<SeqOut, Error> {
        Ok(SeqOut(Array::new()))
    }
    fn serialize_tuple(self, _len: usize) -> Result<SeqOut, Error> {
        Ok(SeqOut(Array::new()))
    }
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<SeqOut, Error> {
        Ok(SeqOut(Array::new()))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(unsupported("a tuple variant"))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<ObjOut, Error> {
        Ok(ObjOut {
            obj: Object::new(),
            key: JsValue::UNDEFINED,
        })
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<ObjOut, Error> {
        self.serialize_map(None)
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(unsupported("a struct variant"))
    }
}

impl ser::SerializeSeq for SeqOut {
    type Ok = JsValue;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.0.push(&value.serialize(Ser)?);
        Ok(())
    }
    fn end(self) -> Result<JsValue, Error> {
        Ok(self.0.into())
    }
}

impl ser::SerializeTuple for SeqOut {
    type Ok = JsValue;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<JsValue, Error> {
        Ok(self.0.into())
    }
}

impl ser::SerializeTupleStruct for SeqOut {
    type Ok = JsValue;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<JsValue, Error> {
        Ok(self.0.into())
    }
}

impl ser::SerializeMap for ObjOut {
    type Ok = JsValue;
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        let key = key.serialize(Ser)?;
        if !key.is_string() {
            return Err(unsupported("a map key that is not a string"));
        }
        self.key = key;
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let key = std::mem::replace(&mut self.key, JsValue::UNDEFINED);
        self.set(&key, value.serialize(Ser)?)
    }
    fn end(self) -> Result<JsValue, Error> {
        Ok(self.obj.into())
    }
}

impl ser::SerializeStruct for ObjOut {
    type Ok = JsValue;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        let value = value.serialize(Ser)?;
        with_name(key, |key| self.set(key, value))
    }
    fn end(self) -> Result<JsValue, Error> {
        Ok(self.obj.into())
    }
}
