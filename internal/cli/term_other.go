//go:build !unix

package cli

import "os"

// terminalWidth returns 0: the width is not known here (80 is assumed).
func terminalWidth(*os.File) int { return 0 }
