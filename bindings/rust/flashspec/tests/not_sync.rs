//! Context is Send but not Sync (checked at compile time).
trait MaybeSync {
    const SYNC: bool = false;
}
impl<T: ?Sized> MaybeSync for T {}
struct Probe<T: ?Sized>(std::marker::PhantomData<T>);
impl<T: ?Sized + Sync> Probe<T> {
    const SYNC: bool = true;
}

fn assert_send<T: Send>() {}

#[test]
fn context_is_send_not_sync() {
    assert_send::<flashspec::Context>();
    assert!(!<Probe<flashspec::Context>>::SYNC);
    assert!(<Probe<u8>>::SYNC);
}
