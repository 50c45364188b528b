package fake

// SetCloseHook sets the hook CloseMemHandle runs between the count of a
// handle's last close and its unmapping; the returned func unsets it.
func SetCloseHook(f func()) (restore func()) {
	closeHook = f
	return func() { closeHook = nil }
}
