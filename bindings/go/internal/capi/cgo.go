// Package capi is the SWIG-generated raw layer of the FlashSpec C API.
package capi

// #cgo pkg-config: flashspec
import "C"
