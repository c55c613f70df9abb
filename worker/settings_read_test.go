package worker_test

import "github.com/crdbwork/crdbwork/claim"

// holdToggle is hold as a claim.Toggle.
func holdToggle(hold bool) claim.Toggle {
	if hold {
		return claim.On
	}
	return claim.Off
}
