package claim_test

import (
	"fmt"
	"log"

	"github.com/crdbwork/crdbwork/claim"
)

// Welcome is the typed arguments of the items of kind "welcome".
type Welcome struct {
	User string `json:"user"`
}

func (Welcome) Kind() string { return "welcome" }

// The item of typed arguments: the kind, and the arguments as JSON. Set
// its other fields before enqueueing it.
func ExampleArgsItem() {
	it, err := claim.ArgsItem(Welcome{User: "ada"})
	if err != nil {
		log.Fatal(err)
	}
	it.Key = "ada"
	fmt.Println(it.Kind, string(it.Payload))
	// Output: welcome {"user":"ada"}
}
